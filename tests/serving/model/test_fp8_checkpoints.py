"""Published FP8 checkpoints load as they are stored, with a LoRA adapter on a row: the
compressed-tensors schemes (per channel, per tensor with a static input scale, per block)
as that package writes them, and transformers' fine-grained FP8 (per block) as transformers
writes it. Logits match transformers + PEFT over the same weights dequantized by those
libraries (fp8_checkpoints.dequantized_reference), in a prefill and the decode steps after;
a DoRA adapter's norms are taken over those dequantized weights too."""

import json

import pytest
import torch
from peft import PeftModel

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.errors import ModelLoadError
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.loader import quantize_on_load
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.model.fp8_checkpoints import (
    block_scheme,
    dequantized_reference,
    write_compressed_tensors,
    write_transformers_fp8,
)
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # Phi-3's
# (family, how the checkpoint is written, what its linears should load as)
FORMATS = {
    "channel": ("qwen2", lambda f: write_compressed_tensors("qwen2", f, "FP8_DYNAMIC"), None),
    "tensor": ("llama", lambda f: write_compressed_tensors("llama", f, "FP8"), None),
    "ct-block": (
        "llama",
        lambda f: write_compressed_tensors("llama", f, block_scheme((32, 16))),
        (32, 16),
    ),
    "hf-block": ("llama", lambda f: write_transformers_fp8("llama", f, (16, 16)), (16, 16)),
    "hf-block-phi3": ("phi3", lambda f: write_transformers_fp8("phi3", f, (16, 16)), (16, 16)),
}
DORA = {"hf-block"}  # a DoRA adapter: its norms over the weights as dequantized by block


@pytest.fixture(scope="module", params=list(FORMATS))
def served(request, tmp_path_factory):
    family, write, block = FORMATS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder = write(root)
    _, hf = save_tiny(family, root / "float")
    adapter_dir, _ = save_peft_adapter(root / "adapter", rank=4, seed=1, base=hf,
                                       modules=FUSED if family == "phi3" else ALL,
                                       use_dora=request.param in DORA)  # fmt: skip
    reference = PeftModel.from_pretrained(dequantized_reference(folder), adapter_dir,
                                          adapter_name="a").eval()  # fmt: skip
    model = LlamaModel(load_model_config(folder), load_state_dict(folder), fp8=True,
                       dtype=torch.float32)  # fmt: skip
    spec = BaseModelSpec.from_dir(folder)
    adapter = load_adapter(adapter_dir, base=spec)
    slab = AdapterSlab(spec, num_slots=2, max_rank=8, max_cpu_loras=0, loader={"a": adapter}.__getitem__,
                       base_weight=model.served_weight)  # fmt: skip
    yield model, reference, slab, slab.acquire("a"), block
    slab.close()


def _reference(reference, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [2, T, vocab]: row 0 under the adapter, row 1 base; row 0 base) in float64.
    (Row by row: PEFT takes no mixed batch with DoRA.)"""
    with torch.no_grad():
        adapted = reference(tokens[:1]).logits
        with reference.disable_adapter():
            base = reference(tokens).logits
    return torch.cat([adapted, base[1:]]).double(), base[0].double()


def test_fp8_checkpoints_load_as_stored_and_serve_an_adapter(served):
    model, reference, slab, slot, block = served
    layer = model.layers[0]
    for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
        assert linear.weight.dtype == torch.float8_e4m3fn and linear.block == block
    tokens = torch.randint(0, 200, (2, 6), generator=torch.Generator().manual_seed(0))
    seqs = [Seq(tokens[0].tolist(), slot=slot), Seq(tokens[1].tolist())]  # adapted, base
    kv, pool = model.allocate_kv(num_blocks=32, block_size=BLOCK), BlockPool(32)
    got = model.forward(plan_step(step_for(seqs, BLOCK, pool), kv, slab)).double().view(2, 6, -1)
    want, base = _reference(reference, tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got[0] - base).abs().max() > 1e-2  # the adapter changed its row
    for i in range(2):
        nxt = torch.randint(0, 200, (2, 1), generator=torch.Generator().manual_seed(i))
        tokens = torch.cat([tokens, nxt], dim=1)
        for s, t in zip(seqs, nxt):
            s.tokens.append(int(t))
        got = model.forward(plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab))
        torch.testing.assert_close(got.double(), _reference(reference, tokens)[0][:, -1],
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


def test_linears_the_checkpoint_kept_in_high_precision_load_as_stored(tmp_path):
    folder = write_compressed_tensors("qwen2", tmp_path, "FP8_DYNAMIC", ignore=("lm_head", "re:.*down_proj$"))  # fmt: skip
    fp8 = quantize_on_load("auto", prequantized=True, device="cpu")
    model = LlamaModel(load_model_config(folder), load_state_dict(folder), fp8=fp8,
                       dtype=torch.float32)  # fmt: skip
    layer = model.layers[1]
    assert layer.down.weight.dtype == torch.float32 and layer.down.scale is None
    assert layer.gate_up.weight.dtype == torch.float8_e4m3fn
    tokens = [3, 1, 4, 1, 5, 9]
    got = model.forward(plan_step(step_for([Seq(tokens)], BLOCK, BlockPool(8)), model.allocate_kv(8, BLOCK)))  # fmt: skip
    with torch.no_grad():
        want = dequantized_reference(folder)(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got.view(len(tokens), -1), want, rtol=1e-4, atol=1e-4)


def test_only_quantization_fp8_quantizes_what_a_prequantized_checkpoint_kept():
    assert not quantize_on_load("auto", prequantized=True, device="cpu")
    assert quantize_on_load("fp8", prequantized=True, device="cpu")
    assert quantize_on_load("fp8", prequantized=False, device="cpu")
    assert not quantize_on_load("auto", prequantized=False, device="cpu")  # no FP8 cores
    assert not quantize_on_load("none", prequantized=False, device="cpu")


def _quantization(folder, config: dict) -> None:
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "quantization_config": config}))


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quantization 'gptq' is not supported"),
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [16, 16]},
         "activation_scheme 'static'"),
        ({"quant_method": "fp8"}, "without weight_block_size"),
        ({"quant_method": "fp8", "weight_block_size": [0, 16]}, "weight_block_size [0, 16]"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}},
         "format 'pack-quantized'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
         "4-bit int are not supported"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}},
         "strategy 'group'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "kv_cache_scheme": {"num_bits": 8}, "config_groups": {}}, "kv_cache_scheme"),
    ],
)  # fmt: skip
def test_a_quantization_that_cannot_load_as_stored_is_named(tmp_path, config, named):
    folder, _ = save_tiny("llama", tmp_path / "m")
    _quantization(folder, config)
    with pytest.raises(ModelLoadError, match=named.replace("[", r"\[")):
        load_model_config(folder)


def test_scales_of_the_wrong_shape_or_a_missing_one_are_named(tmp_path):
    folder = write_transformers_fp8("llama", tmp_path, (16, 16))
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight_scale_inv"
    state[name] = state[name][:1]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"k_proj.weight_scale_inv has shape \(1, 4\), "
                                             r"blocks of \(16, 16\) over \[32, 64\] imply \(2, 4\)"):  # fmt: skip
        LlamaModel(
            load_model_config(folder), load_state_dict(folder), fp8=True, dtype=torch.float32
        )
    del state[name]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ModelLoadError, match=r"k_proj\.weight is FP8 but .*weight_scale_inv is missing"
    ):
        LlamaModel(
            load_model_config(folder), load_state_dict(folder), fp8=True, dtype=torch.float32
        )
