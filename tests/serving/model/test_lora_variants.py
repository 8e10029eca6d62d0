"""PEFT's LoRA variants (DoRA, rank_pattern/alpha_pattern, lora_bias) served in one mixed
batch with plain adapters and base rows, against PEFT's own forward of each row's adapter;
over an FP8 base, DoRA's norms are of the dequantized weights the model computes with."""

import pytest
import torch
from peft import PeftModel

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from kernels import quantize_fp8
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_base, save_peft_adapter, tiny_llama
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VARIANTS = {  # name: save_peft_adapter keywords
    "plain": {"rank": 8, "modules": ("q_proj", "v_proj")},
    "dora": {"rank": 4, "modules": (*ALL, "lm_head"), "use_dora": True},
    "outer": {"rank": 6, "modules": ("embed_tokens", "lm_head", "v_proj")},
    "bias": {"rank": 8, "modules": ("q_proj", "down_proj", "lm_head"), "lora_bias": True},
    "patterns": {
        "rank": 8, "modules": ALL, "alpha": 12,
        "rank_pattern": {"q_proj": 2, "layers.1.mlp.down_proj": 16},
        "alpha_pattern": {"v_proj": 3, r"layers\.0\.mlp\.up_proj": 40},
    },
    "dora_rslora": {
        "rank": 8, "modules": ("k_proj", "gate_proj"), "use_dora": True, "rslora": True,
        "rank_pattern": {"gate_proj": 4},
    },
}  # fmt: skip
ROWS = [
    "dora",
    "__base__",
    "plain",
    "outer",
    "bias",
    "patterns",
    "__base__",
    "dora_rslora",
    "outer",
    "dora",
]


def fp8_roundtrip(model):
    """The HF model with every linear of its layers replaced by its FP8 quantize-dequantize."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.startswith("model.layers.") and isinstance(module, torch.nn.Linear):
                w_q, scale = quantize_fp8(module.weight)
                module.weight.copy_(w_q.to(torch.float32) * scale[:, None])
    return model


def build(root, fp8: bool):
    base_dir = save_base(root / "base")
    dirs = {
        name: save_peft_adapter(root / name, seed=i + 1, **kw)[0]
        for i, (name, kw) in enumerate(VARIANTS.items())
    }
    hf = fp8_roundtrip(tiny_llama()) if fp8 else tiny_llama()
    peft = PeftModel.from_pretrained(hf, dirs["plain"], adapter_name="plain")
    for name in VARIANTS:
        if name != "plain":
            peft.load_adapter(dirs[name], adapter_name=name)
    peft.eval()
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {name: load_adapter(d, base=spec, max_rank=16) for name, d in dirs.items()}
    model = LlamaModel(
        load_model_config(base_dir), load_state_dict(base_dir), fp8=fp8, dtype=torch.float32
    )
    slab = AdapterSlab(
        spec, num_slots=6, max_rank=16, max_cpu_loras=0, loader=loaded.__getitem__,
        base_weight=model.served_weight, embeddings=True,
    )  # fmt: skip
    slots = {name: slab.acquire(name) for name in loaded}
    return model, peft, slab, slots, loaded


def peft_rows(peft, tokens, names):
    """Each row's logits under its own adapter, one PEFT forward per adapter (PEFT's mixed
    batches refuse DoRA)."""
    rows = {}
    with torch.no_grad():
        for name in set(names):
            idx = [i for i, n in enumerate(names) if n == name]
            if name == "__base__":
                with peft.disable_adapter():
                    logits = peft(tokens[idx]).logits
            else:
                peft.set_adapter(name)
                logits = peft(tokens[idx]).logits
            for j, i in enumerate(idx):
                rows[i] = logits[j].double()
    return torch.stack([rows[i] for i in range(len(names))])


@pytest.fixture(scope="module", params=[False, True], ids=["fp32", "fp8"])
def setup(request, tmp_path_factory):
    model, peft, slab, slots, loaded = build(tmp_path_factory.mktemp("variants"), request.param)
    yield model, peft, slab, slots, loaded
    slab.close()


def test_the_variants_are_read_as_peft_wrote_them(setup):
    *_, loaded = setup
    assert loaded["dora"].variants == ("use_dora",)
    assert loaded["bias"].variants == ("lora_bias",)
    assert loaded["patterns"].variants == ("alpha_pattern", "rank_pattern")
    p = loaded["patterns"]
    assert p.rank == 16 and p.modules[0, "q_proj"].a.shape[0] == 2
    assert p.modules[1, "down_proj"].a.shape[0] == 16 and p.modules[0, "down_proj"].a.shape[0] == 8
    assert p.modules[0, "v_proj"].scale == 3 / 8 and p.modules[0, "up_proj"].scale == 40 / 8
    assert p.modules[1, "up_proj"].scale == 12 / 8
    outer = loaded["outer"]
    assert outer.modules[-1, "embed_tokens"].a.shape == (6, 100)  # [r, vocab]
    assert outer.modules[-1, "lm_head"].b.shape == (100, 6)  # [vocab, r]
    assert any("copies of the base model's own weights" in w for w in outer.warnings)


def test_mixed_batch_matches_peft_row_by_row(setup):
    model, peft, slab, slots, _ = setup
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (len(ROWS), 9), generator=gen)
    want = peft_rows(peft, tokens, ROWS)
    with torch.no_grad(), peft.disable_adapter():
        base = peft(tokens).logits.double()
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, ROWS)]
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(64)), kv, slab)).double()
    got = got.view(len(ROWS), tokens.shape[1], -1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(ROWS):
        if n != "__base__":  # each variant really changed its row
            assert (got[i] - base[i]).abs().max() > 1e-2, n


def test_decode_steps_keep_each_rows_variant(setup):
    model, peft, slab, slots, _ = setup
    names = ["patterns", "dora_rslora", "__base__", "outer", "bias"]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 100, (len(names), 5), generator=gen)
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    model.forward(plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab))
    for _ in range(2):
        nxt = torch.randint(0, 100, (len(names), 1), generator=gen)
        tokens = torch.cat([tokens, nxt], dim=1)
        for s, t in zip(seqs, nxt):
            s.tokens.append(int(t))
        got = model.forward(
            plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab)
        ).double()
        want = peft_rows(peft, tokens, names)[:, -1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_embedding_lora_needs_a_slab_that_holds_it(setup):
    model, _, _, _, loaded = setup
    slab = AdapterSlab(
        _spec_of(model), num_slots=2, max_rank=16, max_cpu_loras=0, loader=loaded.__getitem__,
        base_weight=model.served_weight,
    )  # fmt: skip
    try:
        with pytest.raises(AdapterError, match=r"set lora\.embeddings: true"):
            slab.acquire("outer")
        assert slab.acquire("plain") >= 0  # the slab itself still serves
    finally:
        slab.close()


def test_dora_needs_the_base_weights(setup):
    model, _, _, _, loaded = setup
    slab = AdapterSlab(_spec_of(model), num_slots=2, max_rank=16, max_cpu_loras=0,
                       loader=loaded.__getitem__)  # fmt: skip
    try:
        with pytest.raises(AdapterError, match="uses DoRA, which this slab cannot serve"):
            slab.acquire("dora_rslora")
    finally:
        slab.close()


def _spec_of(model) -> BaseModelSpec:
    c = model.config
    return BaseModelSpec.from_config({
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "num_hidden_layers": c.num_layers, "vocab_size": c.vocab_size,
    })  # fmt: skip
