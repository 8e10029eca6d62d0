"""The FP8 checkpoint formats a base model loads as they are: which, and how its scales read.

A checkpoint's config.json `quantization_config` names its format:

    compressed-tensors  (llm-compressor's `*-FP8-dynamic` and `*-FP8` checkpoints, and what
                        `loraserve quantize` writes): `weight` float8_e4m3fn [out, in] and
                        `weight_scale` float32 per channel [out, 1], per tensor [1], or per
                        block [ceil(out/bo), ceil(in/bi)]
    fp8                 (transformers' fine-grained FP8, as in Qwen3-FP8): `weight` and
                        `weight_scale_inv` [ceil(out/bo), ceil(in/bi)], weight_block_size (bo, bi)
    loraserve-fp8       (what `loraserve quantize` wrote before): `weight_scale` [out]

In every one the dequantized weight is weight * scale, the scale broadcast over its channel,
tensor or block. The checkpoint's activation scheme is not followed (a static `input_scale`
is not read): activations stay in the model's dtype (the weight-streaming kernels, the CPU)
or are quantized per token as the step runs, each token's own range at least as accurate as
one calibrated for all. A linear stored without a scale
(one the checkpoint's `ignore` list kept in high precision) loads as it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving.model.errors import ModelLoadError

LORASERVE = "loraserve-fp8"
COMPRESSED_TENSORS = "compressed-tensors"
TRANSFORMERS_FP8 = "fp8"
SUPPORTED = (COMPRESSED_TENSORS, TRANSFORMERS_FP8, LORASERVE)
_WEIGHT_STRATEGIES = ("channel", "tensor", "block")


@dataclass(frozen=True)
class Fp8Format:
    """How a pre-quantized checkpoint stores its FP8 linears."""

    method: str  # one of SUPPORTED
    scale_suffix: str  # the scale's name beside `<linear>.weight`: ".weight_scale", "..._inv"
    block: tuple[int, int] | None = None  # (out, in) rows and columns per scale; None: per row


def fp8_format(raw: dict[str, Any], where: str) -> Fp8Format | None:
    """The FP8 format config.json's quantization_config names; None when it has none.
    ModelLoadError, naming the setting, for a quantization the model cannot load as stored."""
    quant = raw.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise ModelLoadError(f"{where}: quantization_config is not an object")
    method = quant.get("quant_method")
    if method == LORASERVE:
        return Fp8Format(LORASERVE, ".weight_scale")
    if method == TRANSFORMERS_FP8:
        return _transformers_fp8(quant, where)
    if method == COMPRESSED_TENSORS:
        return _compressed_tensors(quant, where)
    raise ModelLoadError(
        f"{where}: quantization {method!r} is not supported (FP8 checkpoints load in "
        f"{', '.join(SUPPORTED)}); load the original weights (quantization fp8 quantizes them) "
        f"or use `loraserve quantize`"
    )


def _transformers_fp8(quant: dict, where: str) -> Fp8Format:
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        raise ModelLoadError(f"{where}: fp8 activation_scheme {quant['activation_scheme']!r} "
                             f"is not supported (dynamic)")  # fmt: skip
    block = quant.get("weight_block_size")
    if block is None:
        raise ModelLoadError(f"{where}: fp8 quantization without weight_block_size is not "
                             f"supported (block-wise scales, as transformers writes them)")  # fmt: skip
    return Fp8Format(
        TRANSFORMERS_FP8, ".weight_scale_inv", _block(block, where, "weight_block_size")
    )


def _compressed_tensors(quant: dict, where: str) -> Fp8Format:
    what = f"{where}: compressed-tensors"
    if quant.get("format") not in ("float-quantized", "naive-quantized"):
        raise ModelLoadError(f"{what} format {quant.get('format')!r} is not supported "
                             f"(float-quantized: FP8 weights)")  # fmt: skip
    if quant.get("kv_cache_scheme"):
        raise ModelLoadError(f"{what} kv_cache_scheme is not supported (the KV cache is kept "
                             f"in the model's dtype); remove it to serve the weights")  # fmt: skip
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ModelLoadError(f"{what}: config_groups is missing or empty")
    blocks = set()
    for name, group in groups.items():
        weights = (group or {}).get("weights") or {}
        if (weights.get("type"), weights.get("num_bits")) != ("float", 8):
            raise ModelLoadError(f"{what} group {name}: weights of {weights.get('num_bits')}-bit "
                                 f"{weights.get('type')} are not supported (8-bit float)")  # fmt: skip
        if not weights.get("symmetric", True) or weights.get("dynamic"):
            raise ModelLoadError(f"{what} group {name}: weights must be symmetric and static")
        strategy = weights.get("strategy")
        if strategy not in _WEIGHT_STRATEGIES:
            raise ModelLoadError(f"{what} group {name}: weight strategy {strategy!r} is not "
                                 f"supported ({', '.join(_WEIGHT_STRATEGIES)})")  # fmt: skip
        if group.get("output_activations"):
            raise ModelLoadError(f"{what} group {name}: output_activations are not supported")
        blocks.add(_block(weights.get("block_structure"), where, "block_structure")
                   if strategy == "block" else None)  # fmt: skip
    if len(blocks) > 1:
        raise ModelLoadError(f"{what}: groups mixing block-wise and per-channel scales are not "
                             f"supported")  # fmt: skip
    return Fp8Format(COMPRESSED_TENSORS, ".weight_scale", blocks.pop())


def _block(value: object, where: str, key: str) -> tuple[int, int]:
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):  # fmt: skip
        raise ModelLoadError(f"{where}: {key} {value!r} is not two positive ints")
    return int(value[0]), int(value[1])
