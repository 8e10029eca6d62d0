"""The LoRA ops in plain torch: the path the CPU (and the CPU demo) runs.

Each distinct rank in the step is one `grouped_mm` over the whole slab: the
adapters' A (or B) stacks are the groups, and slots with no tokens are empty
groups that cost nothing. So there is no per-adapter Python loop and no copy
of adapter weights, and a rank-r adapter reads only the first r rows of its
slot (`A[:, :r]` is a strided view, never materialized).

`grouped_mm` needs 16-byte aligned strides. Real models' widths are multiples
of 64; for any other width the same arithmetic runs as a loop over segments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.segments import RankGroup, Segments

_ALIGN_BYTES = 16


def lora_shrink_torch(
    x: torch.Tensor, lora_a: tuple[torch.Tensor, ...], out: torch.Tensor, segments: Segments
) -> None:
    """out[s, t, :rank] = x[t] @ lora_a[s][slot(t), :rank].T for every active token t.

    x: [num_tokens, hidden]; lora_a[s]: [num_slots, max_rank, hidden];
    out: [num_slices, num_tokens, max_rank]. Columns past a slot's rank and
    rows of base-only tokens are left untouched.
    """
    if segments.num_active == 0:
        return
    order = segments.token_order
    xs = x.index_select(0, order)  # [num_active, hidden], tokens in segment order
    for group in segments.rank_groups:
        rows = order[group.start : group.end]
        xg = xs[group.start : group.end]
        for s, a in enumerate(lora_a):
            a_t = a[:, : group.rank].transpose(1, 2)  # [num_slots, hidden, r], a view of the slab
            t = _grouped_mm(xg, a_t, group)  # [n, r]
            out[s, :, : group.rank].index_copy_(0, rows, t.to(out.dtype))


def lora_expand_torch(
    t: torch.Tensor,
    lora_b: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    segments: Segments,
    scales: torch.Tensor,
) -> None:
    """y[t, slice s] += scales[slot(t)] * t[s, t, :rank] @ lora_b[s][slot(t), :rank] for active t.

    t: [num_slices, num_tokens, max_rank]; lora_b[s]: [num_slots, max_rank, out_s];
    y: [num_tokens, sum(out_s)], the slices side by side (fused qkv / gate_up).
    """
    if segments.num_active == 0:
        return
    order = segments.token_order
    # The scale is folded into t, the small side: [n, r] multiplies instead of [n, out].
    token_scale = scales.index_select(0, segments.token_slots).to(torch.float32)[:, None]
    for group in segments.rank_groups:
        rows = order[group.start : group.end]
        scale = token_scale[group.start : group.end]
        parts = []
        for s, b in enumerate(lora_b):
            ts = _aligned_rows(t[s].index_select(0, rows)[:, : group.rank] * scale, b.dtype)
            parts.append(_grouped_mm(ts, b[:, : group.rank], group))
        delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [n, sum(out_s)]
        y.index_add_(0, rows, delta.to(y.dtype))


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, group: RankGroup) -> torch.Tensor:
    """[n, k] @ b[slot] per segment of the group -> [n, m]; b: [num_slots, k, m]."""
    if _is_aligned(a) and _is_aligned(b):
        return F.grouped_mm(a, b, offs=group.offs)
    out = a.new_empty(a.shape[0], b.shape[2])
    base = group.start
    for slot, lo, hi in zip(group.seg_slots, group.seg_bounds, group.seg_bounds[1:]):
        torch.mm(a[lo - base : hi - base], b[slot], out=out[lo - base : hi - base])
    return out


def _aligned_rows(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t [n, r] in `dtype`, as a view of a buffer whose row stride is 16-byte aligned."""
    per = _ALIGN_BYTES // t.new_empty((), dtype=dtype).element_size()
    width = -(-t.shape[1] // per) * per
    buf = t.new_empty(t.shape[0], width, dtype=dtype)
    buf[:, : t.shape[1]] = t
    return buf[:, : t.shape[1]]


def _is_aligned(t: torch.Tensor) -> bool:
    size = t.element_size()
    strides = [st for st in t.stride() if st != 1]
    return t.data_ptr() % _ALIGN_BYTES == 0 and all(st * size % _ALIGN_BYTES == 0 for st in strides)
