"""The base model's linears: FP8 or high-precision weights, plus each token's LoRA adapter.

A projection may be fused (q|k|v, gate|up): one base matmul over the concatenated
weight, then the LoRA of every slice in one shrink and one multi-slice expand,
each token using its own adapter slot (see kernels/lora_ops.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from kernels import (
    Segments,
    dequantize_fp8,
    dequantize_fp8_blocks,
    dora_rescale,
    fp8_block_linear,
    fp8_linear,
    lora_apply_planned,
    lora_bias_add,
    lora_expand,
    lora_shrink,
    pack_weight,
    packed_linear,
    quantize_fp8,
)
from kernels.cpu_gemm import ROW_BUCKETS
from serving.model.errors import ModelLoadError


@dataclass(frozen=True)
class Linear:
    """y = x @ W.T (+ bias); W stored either as-is or as FP8 with per-output-channel scales
    (or per block of `block` rows and columns, as a checkpoint stored them)."""

    weight: torch.Tensor  # [out, in]: the dtype of the model, or float8_e4m3fn
    scale: torch.Tensor | None  # float32 when weight is FP8: [out], or [out/bo, in/bi] by block
    bias: torch.Tensor | None  # [out]
    packed: torch.Tensor | None = None  # the weight prepacked for the CPU (kernels.cpu_gemm)
    block: tuple[int, int] | None = None  # (bo, bi) rows and columns per scale; None: per row

    @staticmethod
    def make(weight: torch.Tensor, bias: torch.Tensor | None, *, fp8: bool) -> Linear:
        if not fp8:
            return Linear(weight, None, bias, pack_weight(weight))
        w_q, scale = quantize_fp8(weight)
        return Linear(w_q, scale, bias)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def dequantized_rows(self, start: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """W[start : start + rows] [rows, in] in dtype, as this linear computes with it."""
        weight = self.weight[start : start + rows]
        if self.scale is None or self.block is None:
            scale = None if self.scale is None else self.scale[start : start + rows]
            return dequantized(weight, scale, None, dtype)
        bo = self.block[0]  # a fused part starts on a block of rows (concat_linears)
        scale = self.scale[start // bo : -(-(start + rows) // bo)]
        return dequantized(weight, scale, self.block, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.block is not None:
            return fp8_block_linear(x, self.weight, self.scale, self.block, self.bias)
        if self.scale is not None:
            return fp8_linear(x, self.weight, self.scale, self.bias)
        if self.packed is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            return packed_linear(x, self.weight, self.packed, self.bias)
        return torch.nn.functional.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class LoraStacks:
    """One projection's slab stacks, a slice per fused part: A_s [slots, r, in], B_s [slots, r, out_s];
    the lora_B biases and DoRA output scales [slots, out_s] where the step needs them."""

    a: tuple[torch.Tensor, ...]
    b: tuple[torch.Tensor, ...]
    bias: tuple[torch.Tensor, ...] = ()
    dora: tuple[torch.Tensor, ...] = ()
    ranks: torch.Tensor | None = None  # [slices, slots] int32: each module's own rank
    host_ranks: list[list[int]] | None = None  # the same as lists (the CPU path's loops)


@dataclass(frozen=True)
class RowSet:
    """Tokens of a step whose slot uses an addition: rows [n] int64 and their slots [n]."""

    rows: torch.Tensor
    slots: torch.Tensor


@dataclass(frozen=True)
class StepLora:
    """What every LoRA layer of one step shares: the token segments and the slab's scales,
    and the rows whose adapters carry lora_B biases or DoRA (None: no such row)."""

    segments: Segments
    scales: torch.Tensor  # [num_slots]
    max_rank: int
    bias_rows: RowSet | None = None
    dora_rows: RowSet | None = None
    host_scales: list[float] | None = None  # scales as floats (the CPU path's runs)
    checked: bool = False  # LORASERVE_CHECKS=1: every layer checks its arguments as well


def lora_linear(
    x: torch.Tensor, base: Linear, stacks: LoraStacks | None, lora: StepLora | None
) -> torch.Tensor:
    """y[t] = base(x)[t] + scale(slot t) * (x[t] @ A[slot t].T) @ B[slot t].T, per fused slice;
    then + bias[slot t] (lora_bias) and, for a DoRA slot, y = g[slot t] * (y - b) + b."""
    y = base(x)  # [T, sum(out_s)]
    if stacks is None or lora is None or lora.segments.num_active == 0:
        return y
    num = len(stacks.a)
    if lora.checked:  # the public ops: every argument checked, in every layer
        # Uninitialised: the expand reads only active rows and columns below each rank.
        t = torch.empty(num, x.shape[0], lora.max_rank, dtype=torch.float32, device=x.device)
        a, b = (list(s) if num > 1 else s[0] for s in (stacks.a, stacks.b))
        lora_shrink(x, a, t if num > 1 else t[0], lora.segments, stacks.ranks)
        lora_expand(t if num > 1 else t[0], b, y, lora.segments, lora.scales, stacks.ranks)
    else:  # checked once for the step (the segments' builder): nothing read back here
        lora_apply_planned(x, stacks.a, stacks.b, y, lora.segments, lora.scales, lora.max_rank,
                           stacks.ranks, stacks.host_ranks, lora.host_scales)  # fmt: skip
    # lora_B's bias is part of the LoRA term, so DoRA's output scale covers it too.
    if lora.bias_rows is not None and stacks.bias:
        lora_bias_add(y, stacks.bias, lora.bias_rows.rows, lora.bias_rows.slots)
    if lora.dora_rows is not None and stacks.dora:
        dora_rescale(y, stacks.dora, lora.dora_rows.rows, lora.dora_rows.slots, base.bias)
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over x's last dim, with the statistics in float32.

    weight: [D], or [N, D] for x [T, N, D] (a weight per head row: q and k norms). A float32
    weight beside half-precision x (Gemma's (1 + w)) multiplies in float32 and rounds once,
    as transformers' Gemma norms do; one in x's dtype multiplies there, as Llama's do.
    """
    if x.dtype == weight.dtype == torch.float32 and weight.dim() == 1:  # one fused op, not five
        return torch.rms_norm(x, weight.shape, weight, eps)
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32:
        return (normed * weight).to(x.dtype)
    return weight * normed.to(x.dtype)


def packed_primitives_bound(linears: Iterable[Linear]) -> int:
    """The most oneDNN primitives the packed calls of linears can need (kernels.cpu_gemm):
    one per row count of ROW_BUCKETS and distinct packed weight shape."""
    shapes = {
        (*lin.weight.shape, lin.bias is not None) for lin in linears if lin.packed is not None
    }
    return len(ROW_BUCKETS) * len(shapes)


@dataclass(frozen=True)
class LinearPart:
    """A checkpoint's linear: weight [out, in] (FP8 when scale is set), scale [out] or
    [out/bo, in/bi] by block, bias [out]."""

    weight: torch.Tensor
    scale: torch.Tensor | None
    bias: torch.Tensor | None
    block: tuple[int, int] | None = None  # (bo, bi) of a block-scaled FP8 weight

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in dtype: w * its scales when FP8."""
        return dequantized(self.weight, self.scale, self.block, dtype)


def dequantized(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    block: tuple[int, int] | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """weight [out, in] in dtype: times its scales ([out], or [out/bo, in/bi] by block) when FP8."""
    if scale is None:
        return weight.to(dtype)
    if block is not None:
        return dequantize_fp8_blocks(weight, scale, block, dtype)
    return dequantize_fp8(weight, scale, dtype)


def concat_linears(parts: Sequence[LinearPart], *, fp8: bool) -> Linear:
    """One Linear over [W_0; W_1; ...] (rows stacked), biases concatenated when present.

    Pre-quantized parts stay FP8 (per-row scales concatenate, and per-block ones where every
    part but the last fills whole blocks of rows); others are quantized here when fp8 is
    asked for.
    """
    biases = [p.bias for p in parts]
    bias = torch.cat(biases) if all(b is not None for b in biases) else None
    if all(p.scale is not None for p in parts):
        weight = torch.cat([p.weight.view(torch.uint8) for p in parts]).view(parts[0].weight.dtype)
        block = parts[0].block
        if any(p.block != block for p in parts) or (
            block is not None and any(p.weight.shape[0] % block[0] for p in parts[:-1])
        ):
            shapes = [(tuple(p.weight.shape), p.block) for p in parts]
            raise ModelLoadError(f"checkpoint: the FP8 parts of one fused linear must fill "
                                 f"whole blocks of rows: (shape, block) {shapes}")  # fmt: skip
        return Linear(weight, torch.cat([p.scale for p in parts]), bias, block=block)
    if any(p.scale is not None for p in parts):
        raise ModelLoadError("checkpoint: the parts of one fused linear (q|k|v or gate|up) "
                             "must all be FP8 or all not; the quantization ignores some")  # fmt: skip
    weight = torch.cat([p.weight for p in parts], dim=0)
    return Linear.make(weight, bias, fp8=fp8)
