"""The activation-overflow bound: real adapters pass it, crafted ones that would overflow fail."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter, parse_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.format.overflow import ACTIVATION_BOUND, check_activation_bound, dtype_limit
from tests.adapters.factory import TINY_BASE, TINY_SPEC, peft_config, peft_tensors
from tests.adapters.peft_models import save_base, save_peft_adapter

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
DEMO = Path(__file__).parents[3] / "models" / "demo" / "adapters"
FP16 = BaseModelSpec.from_config({**TINY_BASE, "dtype": "float16"})
BF16 = BaseModelSpec.from_config({**TINY_BASE, "torch_dtype": "bfloat16"})


def _files(alpha=16, a_times=1.0, b_times=1.0, **config):
    tensors = {
        k: v * (a_times if "lora_A" in k else b_times) for k, v in peft_tensors(rank=8).items()
    }
    config = peft_config(rank=8, alpha=alpha, **config)
    return {CONFIG: json.dumps(config).encode(), WEIGHTS: save(tensors)}


def test_base_spec_reads_the_checkpoint_dtype():
    assert (FP16.dtype, BF16.dtype) == ("float16", "bfloat16")
    assert BaseModelSpec.from_config({**TINY_BASE, "dtype": "torch.float16"}).dtype == "float16"
    unknown = {k: v for k, v in TINY_BASE.items() if k != "dtype"}
    assert BaseModelSpec.from_config(unknown).dtype is None
    assert dtype_limit(None) == dtype_limit("float8_e4m3fn") == ("float16", 65504.0)


@pytest.mark.parametrize("init", ["peft", "trained"])
def test_real_peft_adapters_pass_on_a_float16_base(tmp_path, init):
    base = BaseModelSpec.from_dir(save_base(tmp_path / "base"))
    fp16 = BaseModelSpec(base.num_layers, base.shapes, "float16")
    modules = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    path, _ = save_peft_adapter(tmp_path / "a", rank=16, modules=modules, alpha=32)
    if init == "peft":  # PEFT's own initialisation: kaiming A, zero B
        from peft import LoraConfig, get_peft_model

        from tests.adapters.peft_models import tiny_llama

        get_peft_model(
            tiny_llama(), LoraConfig(r=16, target_modules=list(modules))
        ).save_pretrained(path)
    assert load_adapter(path, base=fp16).rank == 16


@pytest.mark.parametrize("name", ["comment", "rot13", "upper"])
def test_trained_demo_adapters_pass_even_the_float16_fallback(name):
    adapter = load_adapter(DEMO / name, draft=DEMO / name / "draft")
    assert adapter.draft is not None


def test_llama_8b_sized_adapter_passes_on_float16():
    """A rank-64 down_proj of Llama-3-8B: PEFT's kaiming A, B of a trained adapter's size."""
    gen = torch.Generator().manual_seed(0)
    a = torch.empty(64, 14336).uniform_(-(14336**-0.5), 14336**-0.5, generator=gen)
    b = torch.randn(4096, 64, generator=gen) * 0.02
    check_activation_bound("x", [("layer 0 down_proj", a, b)], 128 / 64, "float16")


CRAFTED = [
    ("alpha 1e6 makes the scale huge", lambda: _files(alpha=1e6), "scale 125000 .* float16"),
    ("B a thousand times larger", lambda: _files(b_times=1e3), "weights too large"),
    ("A a thousand times larger", lambda: _files(a_times=1e3), "weights too large"),
    ("zero A, B beyond float16", lambda: _files(a_times=0.0, b_times=1e5), "weights too large"),
    ("rsLoRA with alpha 1e4", lambda: _files(alpha=1e4, use_rslora=True), "weights too large"),
]


@pytest.mark.parametrize(
    ("files", "message"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED]
)
def test_crafted_overflowing_adapters_are_refused_on_float16(files, message):
    with pytest.raises(AdapterError, match=message):
        parse_adapter(files(), base=FP16)
    with pytest.raises(AdapterError, match=message):
        parse_adapter(files())  # no base: its dtype is unknown, so float16's range applies
    parse_adapter(files(), base=BF16)  # bfloat16 holds all of these


@pytest.mark.parametrize("base", [FP16, BF16, TINY_SPEC], ids=["fp16", "bf16", "fp32"])
def test_a_scale_beyond_bfloat16_is_refused_on_every_dtype(base):
    with pytest.raises(AdapterError, match=r"scale 1.25e\+39 \(lora_alpha / r\) is beyond"):
        parse_adapter(_files(alpha=1e40), base=base)
    with pytest.raises(AdapterError, match="weights too large"):
        parse_adapter(_files(b_times=1e37), base=base)


def test_the_bound_sits_at_the_dtype_limit():
    a = torch.full((1, 4), 1.0)  # ||A|| = 4
    b = torch.full((1, 1), 1.0)  # ||B|| = 1
    limit = 65504.0
    at = limit / (ACTIVATION_BOUND * 4)
    check_activation_bound("x", [("m", a, b)], at, "float16")
    with pytest.raises(AdapterError, match=r"up to 6.62e\+04 .* beyond float16's 65504"):
        check_activation_bound("x", [("m", a, b)], at * 1.01, "float16")
    check_activation_bound("x", [("m", torch.zeros(8, 0), torch.zeros(0, 8))], 1.0, "float16")


def test_stored_versions_are_not_rescanned():
    adapter = parse_adapter(_files(b_times=1e3), base=BF16)
    again = parse_adapter(_files(b_times=1e3), base=FP16, stored_digest=adapter.digest)
    assert again.digest == adapter.digest  # publish validated it; a replica's load trusts that
