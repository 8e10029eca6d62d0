"""A checkpoint's tensors by name, checked against the shapes its config implies, as the model
takes them: in the model's dtype, its norms with their offset (Gemma 3's (1 + w)), its
linears FP8 with their scales where the checkpoint is pre-quantized."""

from __future__ import annotations

import torch

from serving.model.errors import ModelLoadError
from serving.model.linear import LinearPart


class CheckpointWeights:
    """Checkpoint tensors by name, checked against the shapes the config implies."""

    def __init__(
        self, state: dict[str, torch.Tensor], dtype: torch.dtype, norm_offset: float = 0.0
    ):
        self.state, self.dtype, self.norm_offset = state, dtype, norm_offset

    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        return self.raw(name, shape).to(self.dtype)

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
        return [
            LinearPart(
                whole.weight[start : start + n],
                None if whole.scale is None else whole.scale[start : start + n],
                None,
            )
            for start, n in zip(starts, sizes, strict=True)
        ]

    def linear(self, prefix: str, shape: tuple[int, int], bias: bool) -> LinearPart:
        """A linear as stored: FP8 with its scale when pre-quantized, else in the model dtype."""
        scale_name = f"{prefix}.weight_scale"
        b = self(f"{prefix}.bias", (shape[0],)) if bias else None
        if scale_name in self.state:
            scale = self.raw(scale_name, (shape[0],)).to(torch.float32)
            return LinearPart(self.raw(f"{prefix}.weight", shape), scale, b)
        return LinearPart(self(f"{prefix}.weight", shape), None, b)
