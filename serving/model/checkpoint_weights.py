"""A checkpoint's tensors by name, checked against the shapes its config implies, as the model
takes them: in the model's dtype, its norms with their offset (Gemma 3's (1 + w)), its
linears FP8 with their scales where the checkpoint is pre-quantized (in any of
serving.model.fp8_formats' layouts: per row, per tensor, per block)."""

from __future__ import annotations

import math

import torch

from serving.model.errors import ModelLoadError
from serving.model.fp8_formats import Fp8Format
from serving.model.linear import LinearPart

_FP8 = torch.float8_e4m3fn


class CheckpointWeights:
    """Checkpoint tensors by name, checked against the shapes the config implies."""

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        norm_offset: float = 0.0,
        fp8: Fp8Format | None = None,
    ):
        self.state, self.dtype, self.norm_offset, self.fp8 = state, dtype, norm_offset, fp8

    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = self.raw(name, shape)
        if t.dtype != _FP8:
            return t.to(self.dtype)
        if not name.endswith(".weight") or t.dim() != 2:
            raise ModelLoadError(f"checkpoint: {name} is stored in FP8 where no FP8 format "
                                 f"gives it a scale")  # fmt: skip
        part = self.linear(name.removesuffix(".weight"), tuple(t.shape), False)  # read whole
        return part.dequantized(self.dtype)

    def norm(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """An RMSNorm's scale as the model multiplies by it: w in the model's dtype, or with an
        offset (Gemma's 1 + w) offset + w kept in float32, as transformers computes it."""
        if not self.norm_offset:
            return self(name, shape)
        return self.raw(name, shape).to(torch.float32) + self.norm_offset

    def raw(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.state:
            raise ModelLoadError(f"checkpoint: tensor {name!r} is missing")
        t = self.state[name]
        if shape is not None and tuple(t.shape) != shape:
            raise ModelLoadError(
                f"checkpoint: {name} has shape {tuple(t.shape)}, the config implies {shape}"
            )
        return t

    def rows(self, prefix: str, sizes: tuple[int, ...], in_features: int) -> list[LinearPart]:
        """A fused linear as stored (Phi-3's qkv_proj, gate_up_proj; no bias), split by
        output rows into its parts, in order."""
        whole = self.linear(prefix, (sum(sizes), in_features), False)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        bo = whole.block[0] if whole.block else 1  # a block scale covers bo rows
        if any(start % bo for start in starts):
            raise ModelLoadError(f"checkpoint: {prefix} splits into {sizes} rows, across its "
                                 f"scales' blocks of {bo}")  # fmt: skip
        return [
            LinearPart(
                whole.weight[start : start + n],
                None if whole.scale is None else whole.scale[start // bo : -(-(start + n) // bo)],
                None,
                whole.block,
            )
            for start, n in zip(starts, sizes, strict=True)
        ]

    def scale_name(self, prefix: str) -> str:
        """The name of the scale of the linear at prefix, in this checkpoint's format."""
        return prefix + (self.fp8.scale_suffix if self.fp8 else ".weight_scale")

    def linear(self, prefix: str, shape: tuple[int, int], bias: bool) -> LinearPart:
        """A linear as stored: FP8 with its scale when pre-quantized, else in the model dtype."""
        b = self(f"{prefix}.bias", (shape[0],)) if bias else None
        weight = self.raw(f"{prefix}.weight", shape)
        if self.scale_name(prefix) not in self.state:
            if weight.dtype == _FP8:
                raise ModelLoadError(f"checkpoint: {prefix}.weight is FP8 but "
                                     f"{self.scale_name(prefix)} is missing")  # fmt: skip
            return LinearPart(weight.to(self.dtype), None, b)
        if weight.dtype != _FP8:
            raise ModelLoadError(f"checkpoint: {self.scale_name(prefix)} is stored beside "
                                 f"{prefix}.weight of {weight.dtype}, not float8_e4m3fn")  # fmt: skip
        block = self.fp8.block if self.fp8 else None
        return LinearPart(weight, self._scale(prefix, shape, block), b, block)

    def _scale(self, prefix: str, shape: tuple[int, int], block: tuple[int, int] | None):
        """float32: [out] per row (from [out], [out, 1], or one per tensor), or
        [ceil(out/bo), ceil(in/bi)] per block."""
        name, (out, inp) = self.scale_name(prefix), shape
        scale = self.raw(name).to(torch.float32)
        if block is not None:
            want = (math.ceil(out / block[0]), math.ceil(inp / block[1]))
            if tuple(scale.shape) != want:
                raise ModelLoadError(f"checkpoint: {name} has shape {tuple(scale.shape)}, "
                                     f"blocks of {block} over [{out}, {inp}] imply {want}")  # fmt: skip
            return scale
        if scale.numel() == 1:  # one per tensor: the same for every row
            return scale.reshape(1).expand(out).contiguous()
        if tuple(scale.shape) not in ((out,), (out, 1)):
            raise ModelLoadError(f"checkpoint: {name} has shape {tuple(scale.shape)}, "
                                 f"expected [{out}] or [{out}, 1] (per row) or one value")  # fmt: skip
        return scale.reshape(out)
