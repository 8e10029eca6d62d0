"""Per-row LoRA additions applied after the expand, to the rows that need them only.

    lora_bias_add:  y[t, slice s] += bias_s[slot(t)]                                for t in rows
    dora_rescale:   y[t, slice s] = g_s[slot(t)] * (y[t, slice s] - b_s) + b_s       for t in rows

bias_s is lora_B's bias times the module's scale (lora_bias); g_s is DoRA's per-output
scale m / ||W + scale B A||, and b_s the base linear's own bias, which DoRA leaves
unscaled. `rows` are the tokens whose slot uses the addition, so base rows and plain
LoRA rows cost nothing; one gather and one scatter per call, on any device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def lora_bias_add(
    y: torch.Tensor, biases: Sequence[torch.Tensor], rows: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """y[rows, slice s] += biases[s][slots]; biases[s]: [num_slots, out_s]; returns y.

    y: [num_tokens, sum(out_s)]; rows: [n] int64 token indices; slots: [n] their slots.
    """
    _check(y, biases, rows, slots, "biases")
    delta = _gather(biases, slots).to(y.dtype)  # [n, width]
    y.index_add_(0, rows, delta)
    return y


def dora_rescale(
    y: torch.Tensor,
    scales: Sequence[torch.Tensor],
    rows: torch.Tensor,
    slots: torch.Tensor,
    base_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y[rows, slice s] = scales[s][slots] * (y[rows, slice s] - base_bias) + base_bias.

    scales[s]: [num_slots, out_s]; base_bias: [sum(out_s)] or None. Returns y.
    """
    _check(y, scales, rows, slots, "scales")
    every = rows.numel() == y.shape[0]  # rows is then a permutation of all the tokens
    if every:  # no gather and scatter of y: each token's own slot, in token order
        slots = torch.empty_like(slots).index_copy_(0, rows, slots)
    g = _gather(scales, slots).to(torch.float32)  # [n, width]
    sub = y.to(torch.float32) if every else y.index_select(0, rows).to(torch.float32)
    if base_bias is None:
        sub = sub * g
    else:
        b = base_bias.to(torch.float32)
        sub = (sub - b) * g + b
    if every:
        y.copy_(sub)
    else:
        y.index_copy_(0, rows, sub.to(y.dtype))
    return y


def _gather(tables: Sequence[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """Each slot's rows of the slices' tables side by side: [n, sum(out_s)] (only the n rows
    are copied, never a whole fused table)."""
    rows = [t.index_select(0, slots) for t in tables]
    return torch.cat(rows, dim=1) if len(rows) > 1 else rows[0]


def _check(y, stacks, rows, slots, name: str) -> None:
    if y.dim() != 2:
        raise ValueError(f"y: expected [num_tokens, width], got shape {tuple(y.shape)}")
    width = sum(t.shape[1] for t in stacks)
    if width != y.shape[1]:
        raise ValueError(f"{name}: slices cover {width} columns, y has {y.shape[1]}")
    if rows.shape != slots.shape or rows.dim() != 1:
        raise ValueError(f"rows {tuple(rows.shape)} and slots {tuple(slots.shape)} must be [n]")
