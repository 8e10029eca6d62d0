"""Tiny FP8 checkpoints as their own tools write them: compressed-tensors' schemes (the
package's compressor, as llm-compressor saves) and transformers' fine-grained FP8 (its own
quantizer); and transformers' reading of any of them, the reference the loader must match."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    CompressedTensorsConfig,
    FineGrainedFP8Config,
)
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

from tests.serving.model.hf_models import save_tiny


def _fp8(strategy: str, **kw) -> QuantizationArgs:
    return QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, **kw)


def block_scheme(block: tuple[int, int]) -> QuantizationScheme:
    """compressed-tensors' FP8_BLOCK with blocks of `block` (a tiny model's, not 128 x 128)."""
    return QuantizationScheme(
        targets=["Linear"],
        weights=_fp8("block", dynamic=False, block_structure=list(block)),
        input_activations=_fp8("group", dynamic=True, group_size=block[1]),
    )


def write_compressed_tensors(
    kind: str,
    folder: Path,
    scheme: str | QuantizationScheme,
    ignore: tuple[str, ...] = ("lm_head",),
) -> Path:
    """A tiny `kind` model (hf_models) in compressed-tensors FP8: `scheme` a preset's name
    (FP8_DYNAMIC: per channel; FP8: per tensor, with a static input scale) or a scheme.
    Weight scales as a minmax observer sets them, then compressed and saved as
    llm-compressor does; the modules `ignore` names stay as stored."""
    _, model = save_tiny(kind, folder / "src")
    if isinstance(scheme, str):
        scheme = preset_name_to_scheme(scheme, ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=list(ignore)))  # fmt: skip
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        w = module.weight.data  # [out, in]
        strategy = str(getattr(args.strategy, "value", args.strategy))
        if strategy == "channel":
            low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        elif strategy == "tensor":
            low, high = w.amin().reshape(1), w.amax().reshape(1)
        else:  # block: [out/bo, in/bi]
            bo, bi = args.block_structure
            blocks = w.reshape(w.shape[0] // bo, bo, w.shape[1] // bi, bi)
            low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
        scale, _ = calculate_qparams(low, high, args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "input_scale"):  # a static scheme's: any calibrated value
            module.input_scale.data.fill_(0.05)
    compressor = ModelCompressor.from_pretrained_model(model, "float-quantized")
    compressor.compress_model(model)
    out = folder / "fp8"
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def write_transformers_fp8(kind: str, folder: Path, block: tuple[int, int]) -> Path:
    """A tiny `kind` model quantized by transformers' fine-grained FP8 on loading, saved.
    (transformers quantizes only where a GPU is; the quantizing itself is plain torch, so
    its device check is lifted here.)"""
    src, _ = save_tiny(kind, folder / "src")
    config = FineGrainedFP8Config(weight_block_size=block)
    check = FineGrainedFP8HfQuantizer.validate_environment
    FineGrainedFP8HfQuantizer.validate_environment = lambda self, *a, **k: None
    try:
        model = AutoModelForCausalLM.from_pretrained(src, quantization_config=config)
    finally:
        FineGrainedFP8HfQuantizer.validate_environment = check
    out = folder / "fp8"
    model.save_pretrained(out)
    return out


def dequantized_reference(folder: Path) -> torch.nn.Module:
    """A plain float32 transformers model (no quantization hooks, activations never
    quantized) whose weights are the FP8 checkpoint at folder as transformers reads it:
    each dequantized (w * its scales) by compressed-tensors' decompressor or by transformers'
    fine-grained FP8 loader, never by the code under test."""
    config = AutoConfig.from_pretrained(folder)
    quant = config.quantization_config
    method = quant["quant_method"] if isinstance(quant, dict) else quant.quant_method
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if method == "compressed-tensors" else {}  # fmt: skip
        read = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    weights = {k: v.float() for k, v in read.state_dict().items() if not k.endswith("_scale")}
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = plain.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if missing:
        plain.tie_weights()
    return plain
