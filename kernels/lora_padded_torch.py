"""The padded way of the torch LoRA ops: a rank group's slots as one range of the slab.

Each slot of the group gets a bucket of `bucket` rows (kernels/cpu_plan.py: Padded), so
the shrink and the expand are each one `bmm` per slice over slab[first_slot:end_slot],
with one gather and one scatter for all slices. The slab's paged stacks overlap, so the
range is taken by the stacks' strides (`_slab_range`), never by their shape; a rank-r
group reads only the first r rows of each slot. The other ways are kernels/lora_torch.py.
"""

from __future__ import annotations

from operator import itemgetter

import torch

from kernels.cpu_plan import Padded
from kernels.segments import Segments


def shrink_padded(x, lora_a, out, padded: Padded, r: int) -> None:
    """One bmm per slice over slab[first_slot:end_slot]: slot i multiplies bucket i of the rows."""
    num, bucket = padded.end_slot - padded.first_slot, padded.bucket
    xp = _padded_rows(x, padded)  # [slots in range, bucket, hidden]
    ts = [torch.bmm(xp, _slab_range(a, padded, r, transpose=True)) for a in lora_a]
    # Every slice in one tensor, so the scatter into `out` is one op for all of them.
    t = (torch.stack(ts) if len(ts) > 1 else ts[0]).view(len(ts), num * bucket, r)
    if not padded.dense:
        t = t.index_select(1, padded.positions)
    out[:, :, :r].index_copy_(1, padded.rows, t if t.dtype == out.dtype else t.to(out.dtype))


def _padded_rows(x: torch.Tensor, padded: Padded) -> torch.Tensor:
    """x's rows of the group in its [slots in range, bucket, hidden] layout, padding rows 0."""
    num, bucket = padded.end_slot - padded.first_slot, padded.bucket
    if padded.dense:  # no padding: the rows are the sorted tokens, gathered in one op
        return torch.embedding(x, padded.bucket_rows)
    xp = x.new_zeros(num * bucket, x.shape[1])
    xp.index_copy_(0, padded.positions, x.index_select(0, padded.rows))
    return xp.view(num, bucket, x.shape[1])


def _slab_range(stack: torch.Tensor, padded: Padded, r: int, transpose: bool) -> torch.Tensor:
    """stack[first_slot:end_slot, :r] ([slots, r, width]), or its transpose, as one view."""
    s0, s1, s2 = stack.stride()
    offset = stack.storage_offset() + padded.first_slot * s0
    num, width = padded.end_slot - padded.first_slot, stack.shape[2]
    if transpose:
        return stack.as_strided((num, width, r), (s0, s2, s1), offset)
    return stack.as_strided((num, r, width), (s0, s1, s2), offset)


def expand_padded(t, lora_b, y, padded: Padded, r: int, scales, host_scales) -> None:
    """The shrink's layout again: one bmm per slice, then one index_add_ of every slice."""
    num, bucket, n = padded.end_slot - padded.first_slot, padded.bucket, len(lora_b)
    if padded.dense:  # [slices, slots in range, bucket, r] in one gather
        ts = t[:, padded.bucket_rows, :r]
    else:
        tg = t[:, :, :r].index_select(1, padded.rows)  # [slices, group tokens, r]
        ts = tg.new_zeros(n, num * bucket, r).index_copy_(1, padded.positions, tg)
        ts = ts.view(n, num, bucket, r)
    alpha, row_scale = _padded_scales(padded, scales, host_scales)
    if row_scale is not None:  # padding rows read slots with no token; their rows of ts are 0
        ts = ts * row_scale.to(ts.dtype)
    if ts.dtype != lora_b[0].dtype:
        ts = ts.to(lora_b[0].dtype)
    deltas = [
        torch.bmm(tb, _slab_range(b, padded, r, transpose=False))  # [slots, bucket, out_s]
        for b, tb in zip(lora_b, ts.unbind(0))
    ]
    _add_padded(y, deltas, padded, alpha)


def _add_padded(y, deltas: list[torch.Tensor], padded: Padded, alpha: float) -> None:
    """y[row, slice s] += alpha * deltas[s] at each real row; deltas[s]: [slots, bucket, out_s]."""
    num, bucket = padded.end_slot - padded.first_slot, padded.bucket
    delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas, 2)
    delta = delta.view(num * bucket, delta.shape[2])  # [rows, sum(out_s)]
    if not padded.dense:
        delta = delta.index_select(0, padded.positions)
    if delta.dtype != y.dtype:
        delta = delta.to(y.dtype)
    y.index_add_(0, padded.rows, delta, alpha=alpha)


def lora_apply_padded_torch(x, lora_a, lora_b, y, segments: Segments, scales, host_scales) -> None:
    """y[t, slice s] += scale(slot t) * (x[t] @ A_s[slot t].T) @ B_s[slot t], every group padded.

    The shrink and the expand of a padded group fused: the rank-space rows stay in the
    group's [slots, bucket] layout between the two bmm's, instead of a round trip through
    a [slices, T, max_rank] buffer in token order (a scatter, a gather and a stack saved
    per projection, most of a decode step's LoRA cost at small widths).
    """
    for group in segments.cpu_plan.groups:
        padded, r = group.padded, group.rank
        xp = _padded_rows(x, padded)  # [slots in range, bucket, hidden]
        alpha, row_scale = _padded_scales(padded, scales, host_scales)  # padding rows: 0 in xp
        deltas = []
        for a, b in zip(lora_a, lora_b):
            t = torch.bmm(xp, _slab_range(a, padded, r, transpose=True))  # [slots, bucket, r]
            if row_scale is not None:  # in float32, then B's dtype: the unfused path's rounding
                t = (t.to(torch.float32) * row_scale).to(b.dtype)
            deltas.append(torch.bmm(t, _slab_range(b, padded, r, transpose=False)))
        _add_padded(y, deltas, padded, alpha)


def _padded_scales(padded: Padded, scales, host_scales) -> tuple[float, torch.Tensor | None]:
    """(alpha, None) when every slot of the group has the one scale alpha (the common case,
    applied by index_add_), else (1.0, each row's scale as float32 [slots, bucket, 1])."""
    alpha = _one_scale(padded.slots, host_scales)
    if alpha is not None:
        return alpha, None
    num, bucket = padded.end_slot - padded.first_slot, padded.bucket
    return 1.0, scales.to(torch.float32).index_select(0, padded.row_slots).view(num, bucket, 1)


def _one_scale(slots: tuple[int, ...], host_scales: list[float] | None) -> float | None:
    """The scale every one of slots has, if they have one and the caller gave the scales."""
    if host_scales is None:
        return None
    picked = set(itemgetter(*slots)(host_scales)) if len(slots) > 1 else {host_scales[slots[0]]}
    return picked.pop() if len(picked) == 1 else None
