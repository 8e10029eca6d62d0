"""Loading and validating PEFT LoRA adapters: PEFT's own files round-trip, bad ones are refused."""

import io
import json
import struct
import tarfile
import zipfile

import pytest
import torch
from safetensors.torch import save

from adapters.base_model import BaseModelSpec
from adapters.errors import AdapterError
from adapters.format import load_adapter, parse_adapter
from tests.adapters.factory import TINY_SPEC, peft_adapter_files, peft_config, peft_tensors
from tests.adapters.peft_models import save_base, save_peft_adapter

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@pytest.mark.parametrize(
    ("rank", "modules", "rslora"),
    [
        (4, ("q_proj", "v_proj"), False),
        (16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), False),
        (8, ("down_proj",), True),
        (1, ("k_proj", "up_proj"), False),
    ],
)
def test_peft_adapters_round_trip(tmp_path, rank, modules, rslora):
    path, model = save_peft_adapter(tmp_path / "a", rank=rank, modules=modules, rslora=rslora)
    base = BaseModelSpec.from_dir(save_base(tmp_path / "base"))
    adapter = load_adapter(path, base=base)
    assert adapter.rank == rank and adapter.target_modules == tuple(sorted(modules))
    peft_layers = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {})
    }
    assert len(adapter.modules) == len(peft_layers) == len(modules) * base.num_layers
    for name, layer in peft_layers.items():
        index = int(name.split("layers.")[1].split(".")[0])
        got = adapter.modules[(index, name.rsplit(".", 1)[1])]
        assert torch.equal(got.a, layer.lora_A["default"].weight.detach())
        assert torch.equal(got.b, layer.lora_B["default"].weight.detach())
        assert adapter.scale == pytest.approx(layer.scaling["default"])


def test_sources_agree(tmp_path):
    files = peft_adapter_files()
    folder = tmp_path / "dir"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as t:
        t.add(folder, arcname="my-adapter")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    digests = {
        load_adapter(src).digest
        for src in (folder, tmp_path / "a.tar.gz", tmp_path / "a.zip", files)
    }
    assert len(digests) == 1


def test_digest_is_content():
    a = parse_adapter(peft_adapter_files(seed=1))
    assert parse_adapter(peft_adapter_files(seed=1)).digest == a.digest
    assert parse_adapter(peft_adapter_files(seed=2)).digest != a.digest
    with_draft = parse_adapter(
        peft_adapter_files(seed=1), draft=parse_adapter(peft_adapter_files(seed=3))
    )
    assert with_draft.digest != a.digest and with_draft.draft.rank == 8


def test_no_model_type_and_other_base_name_only_warn():
    files = peft_adapter_files(base_model_name_or_path="meta-llama/Llama-3.1-8B")
    assert "model_type" not in json.loads(files[CONFIG])
    adapter = parse_adapter(files, base=TINY_SPEC, base_name="demo")
    assert len(adapter.warnings) == 1 and "meta-llama/Llama-3.1-8B" in adapter.warnings[0]


def test_checks_needing_no_base_run_without_one():
    files = peft_adapter_files()
    parse_adapter(files)  # no base: shapes are not checked, structure is
    with pytest.raises(AdapterError, match="rank 8 is above"):
        parse_adapter(files, max_rank=4)


def _with_config(**changes):
    files = peft_adapter_files()
    config = json.loads(files[CONFIG])
    config.update(changes)
    return {**files, CONFIG: json.dumps(config).encode()}


def _with_tensors(tensors, **config):
    return {CONFIG: json.dumps(peft_config(**config)).encode(), WEIGHTS: save(tensors)}


def _renamed(old, new):
    t = peft_tensors()
    return _with_tensors({k.replace(old, new): v for k, v in t.items()})


def _poisoned(value):
    t = peft_tensors()
    next(iter(t.values()))[0, 0] = value
    return _with_tensors(t)


def _lying_header():
    data = bytearray(peft_adapter_files()[WEIGHTS])
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"][1] += 10**12  # claims a terabyte
    blob = json.dumps(header).encode()
    return {
        CONFIG: peft_adapter_files()[CONFIG],
        WEIGHTS: struct.pack("<Q", len(blob)) + blob + data[8 + n :],
    }


def _short_header():
    data = peft_adapter_files()[WEIGHTS]
    return {CONFIG: peft_adapter_files()[CONFIG], WEIGHTS: struct.pack("<Q", 10**9) + data[8:]}


MALFORMED = [
    (
        "missing config",
        lambda: {WEIGHTS: peft_adapter_files()[WEIGHTS]},
        "adapter_config.json is missing",
    ),
    (
        "missing weights",
        lambda: {CONFIG: peft_adapter_files()[CONFIG]},
        "adapter_model.safetensors is missing",
    ),
    (
        "pickle weights",
        lambda: {CONFIG: peft_adapter_files()[CONFIG], "adapter_model.bin": b"\x80\x04"},
        "is pickle and is refused; save with",
    ),
    ("config not json", lambda: {**peft_adapter_files(), CONFIG: b"{nope"}, "is not valid JSON"),
    ("not lora", lambda: _with_config(peft_type="IA3"), "peft_type IA3 is not supported"),
    (
        "dora without magnitudes",
        lambda: _with_config(use_dora=True),
        "layer 0 q_proj: use_dora is set but lora_magnitude_vector is missing",
    ),
    (
        "modules_to_save",
        lambda: _with_config(modules_to_save=["lm_head"]),
        "modules_to_save is not supported: merge those modules into the base model, or train",
    ),
    ("bias", lambda: _with_config(bias="lora_only"), "bias 'lora_only' is not supported"),
    (
        "layer patterns",
        lambda: _with_config(layers_pattern="layers"),
        r"layer patterns \(layers_pattern\)",
    ),
    (
        "rank pattern misfit",
        lambda: _with_config(rank_pattern={"q_proj": 4}),
        r"layer 0 q_proj: lora_A \(8, \d+\) and lora_B \(\d+, 8\) do not fit rank 4 \(rank_pattern",
    ),
    (
        "alpha past float's range",
        lambda: _with_config(lora_alpha=10**400),
        "lora_alpha must be a number, got 1000",
    ),
    (
        "alpha pattern past float's range",
        lambda: _with_config(alpha_pattern={"q_proj": 10**400}),
        r"alpha_pattern\['q_proj'\] must be a number",
    ),
    (
        "rank pattern not a regex",
        lambda: _with_config(rank_pattern={"q_proj(": 4}),
        r"rank_pattern: pattern 'q_proj\(' is not a valid regex",
    ),
    (
        "lora_bias without biases",
        lambda: _with_config(lora_bias=True),
        "lora_bias is set but lora_B.bias is missing",
    ),
    ("rank too high", lambda: _with_config(r=128), "rank 128 is above lora.max_lora_rank"),
    ("bad rank", lambda: _with_config(r=0), "r must be a positive integer"),
    (
        "module the base lacks",
        lambda: _renamed("q_proj", "qkv_proj"),
        "the base model has no module 'qkv_proj'",
    ),
    (
        "name matches no module",
        lambda: _renamed("lora_A.weight", "lora_down.weight"),
        "matches no LoRA module",
    ),
    (
        "shape misfit",
        lambda: _with_tensors(
            peft_tensors(modules=("q_proj",))
            | {
                "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight": torch.zeros(
                    8, 65
                ),
                "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight": torch.zeros(
                    32, 8
                ),
            }
        ),
        "do not fit the base model's v_proj",
    ),
    ("rank misfit", lambda: _with_tensors(peft_tensors(rank=4)), "do not fit rank 8"),
    (
        "layer out of range",
        lambda: _renamed("layers.1.", "layers.7."),
        "layer 7 is out of range; the base model has 2",
    ),
    (
        "unpaired",
        lambda: _with_tensors(
            {k: v for k, v in peft_tensors().items() if "layers.0.self_attn.q_proj.lora_B" not in k}
        ),
        "has lora_A without its pair",
    ),
    ("nan", lambda: _poisoned(float("nan")), "contains NaN or Inf"),
    ("inf", lambda: _poisoned(float("inf")), "contains NaN or Inf"),
    (
        "dtype",
        lambda: _with_tensors({k: v.double() for k, v in peft_tensors().items()}),
        "unsupported dtype F64",
    ),
    ("lying header", _lying_header, "header that lies about its offsets"),
    ("short file", _short_header, "safetensors header claims"),
    ("empty weights", lambda: _with_tensors({}), "holds no tensors"),
]


@pytest.mark.parametrize(
    ("files", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_adapters_are_refused_each_with_its_message(files, message):
    with pytest.raises(AdapterError, match=message):
        parse_adapter(files(), base=TINY_SPEC)


def test_messages_are_distinct():
    messages = set()
    for _, files, _ in MALFORMED:
        with pytest.raises(AdapterError) as info:
            parse_adapter(files(), base=TINY_SPEC)
        messages.add(str(info.value))
    assert len(messages) >= len(MALFORMED) - 1  # NaN and Inf share a message


def test_size_limit(tmp_path):
    with pytest.raises(AdapterError, match="over the limit of 1000 bytes"):
        load_adapter(peft_adapter_files(), max_bytes=1000)


@pytest.mark.parametrize("archive", ["a.zip", "a.tar.gz"])
def test_archive_without_weights_and_garbage_archive(tmp_path, archive):
    path = tmp_path / archive
    if archive.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x/adapter_config.json", peft_adapter_files()[CONFIG])
    else:
        with tarfile.open(path, "w:gz") as t:
            info = tarfile.TarInfo("adapter_config.json")
            data = peft_adapter_files()[CONFIG]
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors is missing"):
        load_adapter(path)
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(AdapterError, match="not a readable archive"):
        load_adapter(tmp_path / "bad.zip")


def test_missing_path():
    with pytest.raises(AdapterError, match="no such file or folder"):
        load_adapter("/nonexistent/adapter")


def test_duplicate_and_misplaced_tensors_are_refused():
    t = peft_tensors()
    name = next(k for k in t if "q_proj.lora_A" in k)
    dup = {**t, name.replace("base_model.model.", ""): t[name].clone()}
    with pytest.raises(AdapterError, match="repeats layer 0 q_proj lora_A"):
        parse_adapter(_with_tensors(dup))
    moved = {k.replace("self_attn.q_proj", "mlp.q_proj"): v for k, v in t.items()}
    with pytest.raises(AdapterError, match="puts q_proj under mlp"):
        parse_adapter(_with_tensors(moved))


@pytest.mark.parametrize("field", ["num_attention_heads", "hidden_size", "num_hidden_layers"])
def test_base_config_sizes_must_be_positive(field):
    from adapters.base_model import BaseModelSpec
    from tests.adapters.factory import TINY_BASE

    with pytest.raises(AdapterError, match=f"{field} must be positive"):
        BaseModelSpec.from_config({**TINY_BASE, field: 0})
