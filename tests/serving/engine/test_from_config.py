"""cache.num_blocks auto: the KV blocks a replica's memory budget holds, every model counted."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from serving.config import parse_config
from serving.engine import from_config, memory_budget
from serving.engine.from_config import num_kv_blocks

DEMO_DRAFT = Path(__file__).resolve().parents[3] / "models" / "demo" / "draft"


def fake_model(layers=2, kv_heads=2, head_dim=16, dtype=torch.float32, window=None):
    config = SimpleNamespace(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim)
    return SimpleNamespace(config=config, dtype=dtype, windows=(window,) * layers)


def test_a_number_is_used_as_given():
    cfg = parse_config({"cache": {"num_blocks": 77}})
    assert num_kv_blocks(cfg, [fake_model()], "cpu") == 77


def test_auto_takes_a_share_of_available_ram_for_target_and_draft(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 1 << 30)
    cfg = parse_config({"cache": {"num_blocks": "auto", "block_size": 16}})
    # K and V, 2 layers, 16 tokens, 2 heads of 16, 4 bytes: 8 KiB per block; the draft 4 KiB
    target, draft = fake_model(), fake_model(layers=1)
    budget = int((1 << 30) * from_config.CPU_KV_SHARE)
    assert num_kv_blocks(cfg, [target], "cpu") == budget // 8192
    assert num_kv_blocks(cfg, [target, draft], "cpu") == budget // (8192 + 4096)


def test_auto_is_capped_on_a_large_host(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 1 << 40)
    cfg = parse_config({"cache": {"num_blocks": "auto", "block_size": 16}})
    assert num_kv_blocks(cfg, [fake_model()], "cpu") == from_config.CPU_KV_CAP_BYTES // 8192


def test_auto_refuses_a_budget_below_one_full_length_sequence(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 64 << 10)  # a quarter: 2 blocks
    cfg = parse_config({"cache": {"num_blocks": "auto", "block_size": 16}})
    with pytest.raises(RuntimeError, match=r"set cache\.num_blocks"):
        num_kv_blocks(cfg, [fake_model()], "cpu")


def test_auto_under_a_sliding_window_needs_the_windows_blocks_only(monkeypatch):
    """Every layer slides (window 64 = 4 blocks of 16): a sequence holds about 5 blocks,
    whatever max_model_len (2048 here, 128 blocks)."""
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 4 * 5 * 8192)  # 5 blocks
    cfg = parse_config({"cache": {"num_blocks": "auto", "block_size": 16}})
    assert num_kv_blocks(cfg, [fake_model(window=64)], "cpu") == 5
    with pytest.raises(RuntimeError, match=r"set cache\.num_blocks"):  # a global layer
        num_kv_blocks(cfg, [fake_model(window=None)], "cpu")
    cfg = parse_config({"cache": {"num_blocks": "auto", "block_size": 8}})  # 6, with the draft
    with pytest.raises(RuntimeError, match=r"set cache\.num_blocks"):  # a draft's KV lags
        num_kv_blocks(cfg, [fake_model(window=64), fake_model(layers=1, window=64)], "cpu")


def test_draft_companions_load_into_the_draft_slab(tmp_path):
    from adapters.format.adapter import load_adapter
    from adapters.registry.registry import Registry
    from serving.engine.from_config import build_engine
    from serving.engine.request import GenerateRequest, SamplingParams
    from tests.serving.engine.world import build_world

    world = build_world(tmp_path / "world")
    # The base doubles as its own draft model, so an adapter is its own companion.
    cfg = parse_config({
        "model": {"path": str(world.base_dir), "max_model_len": 256},
        "draft": {"method": "draft_model", "path": str(world.base_dir), "adaptive": False},
        "lora": {"registry": str(tmp_path / "registry"), "max_lora_rank": 16, "max_loras": 2},
        "cache": {"block_size": 4, "num_blocks": 128},
    })  # fmt: skip
    registry = Registry(cfg.lora.registry)
    with_companion = registry.publish(
        "upper", load_adapter(world.root / "upper", draft=world.root / "upper")
    )
    alone = registry.publish("mlp", load_adapter(world.root / "mlp"))
    engine = build_engine(cfg)
    done = {}
    for version in (with_companion.ref, alone.ref):
        greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        engine.submit(GenerateRequest(version, (5, 6, 7, 8), greedy, version), done.setdefault(
            version, []).append)  # fmt: skip
    engine.run_until_idle()
    draft_slab = engine.spec.draft.slab
    assert draft_slab.stats().loads == 1 and draft_slab.stats().failed_loads == 1  # mlp: none
    assert draft_slab.slot_of(with_companion.ref) is not None
    for version, name in ((with_companion.ref, "upper"), (alone.ref, "mlp")):
        tokens = [t for out in done[version] for t in out.new_token_ids]
        assert tokens == world.reference([5, 6, 7, 8], name, 8), name


@pytest.mark.parametrize(("num_cpus", "threads"), [(0, 1), (0.5, 1), (1, 1), (3, 3)])
def test_a_cpu_replica_computes_on_the_cores_it_reserves(num_cpus, threads):
    assert from_config.cpu_threads(num_cpus) == threads


def test_build_engine_sets_the_threads_of_a_cpu_replica(monkeypatch, tmp_path):
    demo = Path(__file__).resolve().parents[3] / "models" / "demo" / "base"
    cfg = parse_config({"model": {"path": str(demo)}, "lora": {"registry": f"file://{tmp_path}"},
                        "deploy": {"resources": {"num_cpus": 3}}})  # fmt: skip
    calls = []
    monkeypatch.setattr(from_config.torch, "set_num_threads", calls.append)
    from_config.build_engine(cfg)
    assert calls == [3]


def test_the_slabs_take_the_memory_the_config_gives(tmp_path):
    from serving.engine.from_config import build_engine

    cfg = parse_config({
        "model": {"path": str(DEMO_DRAFT.parent / "base")},
        "draft": {"method": "draft_model", "path": str(DEMO_DRAFT)},
        "lora": {"registry": f"file://{tmp_path}", "slab_mb": 32, "host_mb": 64,
                 "max_lora_rank": 16, "max_cpu_loras": 5},
        "cache": {"num_blocks": 128},
    })  # fmt: skip
    engine = build_engine(cfg)
    slab, draft = engine.slab, engine.spec.draft.slab
    stats = slab.stats()
    # Pages only: the tail rows and the trainable-token pool take the rest of the 32 MiB.
    assert 0.9 * (32 << 20) < stats.slab_bytes <= 32 << 20 and stats.pages == slab.num_pages
    assert stats.host_bytes == 64 << 20
    pages_of_16 = slab.costs.pages_of(16)
    assert draft.num_pages == stats.pages // pages_of_16 * pages_of_16  # as many adapters
    assert 0 < draft.stats().host_bytes < 64 << 20  # the draft's companions are smaller


def test_a_slab_budget_below_one_adapter_is_refused_naming_its_key(tmp_path):
    from serving.engine.from_config import build_engine

    cfg = parse_config({
        "model": {"path": str(DEMO_DRAFT.parent / "base")},
        "lora": {"registry": f"file://{tmp_path}", "slab_mb": 1, "max_lora_rank": 64},
    })  # fmt: skip
    with pytest.raises(RuntimeError, match=r"lora\.slab_mb 1: .*raise lora\.slab_mb or lower"):
        build_engine(cfg)


def _draft_like_demo(root: Path, vocab_size=None, swap=None) -> Path:
    """The demo's draft model, its config's vocab_size or two tokenizer ids changed."""
    import json
    import shutil

    draft = root / "draft"
    shutil.copytree(DEMO_DRAFT, draft)
    if vocab_size is not None:
        config = json.loads((draft / "config.json").read_text())
        (draft / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    if swap is not None:
        tokenizer = json.loads((draft / "tokenizer.json").read_text())
        vocab, (a, b) = tokenizer["model"]["vocab"], swap
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    return draft


def _draft_config(tmp_path: Path, draft: Path):
    return parse_config({"model": {"path": str(DEMO_DRAFT.parent / "base")},
                         "draft": {"method": "draft_model", "path": str(draft)},
                         "lora": {"registry": f"file://{tmp_path}"}})  # fmt: skip


def test_the_demo_draft_shares_the_target_vocabulary(tmp_path):
    from_config.check_draft_vocab(_draft_config(tmp_path, DEMO_DRAFT))


def test_a_draft_with_another_vocabulary_size_is_refused_before_loading(tmp_path):
    draft = _draft_like_demo(tmp_path, vocab_size=4000)
    with pytest.raises(ValueError, match=r"vocabulary has 4000 tokens, the target's 4096"):
        from_config.build_engine(_draft_config(tmp_path, draft))


def test_a_draft_whose_tokenizer_maps_tokens_to_other_ids_is_refused(tmp_path):
    """Same size, same weights shape: without the check it would load and propose nonsense."""
    draft = _draft_like_demo(tmp_path, swap=("a", "b"))
    with pytest.raises(ValueError, match=r"draft's tokenizer differs .*2 tokens"):
        from_config.build_engine(_draft_config(tmp_path, draft))


def test_a_model_and_draft_at_an_fsspec_url_are_copied_once_and_served(tmp_path, monkeypatch):
    import uuid

    import fsspec

    from serving.api import settings_from_config
    from serving.engine.from_config import build_engine
    from serving.engine.request import GenerateRequest, SamplingParams
    from serving.model.tokenizer import load_tokenizer
    from tests.serving.engine.world import build_world

    world = build_world(tmp_path / "world")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the model cache is ~/.cache/loraserve
    fs, root = fsspec.filesystem("memory"), f"/models-{uuid.uuid4().hex}"
    fs.put(f"{world.base_dir}/", f"{root}/base", recursive=True)
    url = f"memory://{root}/base"
    cfg = parse_config({
        "model": {"path": url, "max_model_len": 256},
        "draft": {"method": "draft_model", "path": url, "adaptive": False},
        "lora": {"registry": str(tmp_path / "registry")},
        "cache": {"block_size": 4, "num_blocks": 64},
    })  # fmt: skip
    try:
        assert cfg.model.path == url  # kept as given: each replica copies it on its machine
        settings = settings_from_config(cfg)
        engine = build_engine(cfg)
    finally:
        fs.rm(root, recursive=True)
    local = load_tokenizer(world.base_dir)
    assert settings.tokenizer.encode("def f(x):") == local.encode("def f(x):")
    assert settings.base_spec.num_layers == 2
    cache = tmp_path / "home" / ".cache" / "loraserve" / "models"
    copies = [p for p in cache.iterdir() if p.is_dir()]  # beside each copy: its lock file
    assert len(copies) == 1  # one copy of the URL for the target, the draft and the settings
    out = []
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.submit(GenerateRequest("r", (5, 6, 7, 8), greedy, None), out.append)
    engine.run_until_idle()
    assert [t for o in out for t in o.new_token_ids] == world.reference([5, 6, 7, 8], None, 6)
