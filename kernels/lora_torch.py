"""The LoRA ops in plain torch: the path the CPU (and the CPU demo) runs.

A rank group (see kernels/cpu_plan.py for which way when) runs in place, one
matmul per long run of adjacent tokens; or padded, its shrink and expand each
one `bmm` per slice over a range of the slab; or grouped, its shrink
`grouped_mm` over the slab and its expand one `embedding_bag` with B's rows as the
table. There is never a copy of adapter weights, and a rank-r adapter reads
only the first r rows of its slot (`A[:, :r]` is a strided view). Every way
works on the slab's paged stacks, whose slots overlap (kernels/lora_checks.py:
check_stacks): they index slots by the stacks' strides, never by their shape.

`grouped_mm` needs 16-byte aligned strides. Real models' widths are multiples
of 64; for any other width the same arithmetic runs as a loop over segments.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter

import torch
import torch.nn.functional as F

from kernels.cpu_plan import Bags, Padded, Part, Run
from kernels.segments import Segments

_ALIGN_BYTES = 16
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def lora_shrink_torch(
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    segments: Segments,
    slice_ranks: list[list[int]] | None = None,
) -> None:
    """out[s, t, :rank] = x[t] @ lora_a[s][slot(t), :rank].T for every active token t.

    x: [num_tokens, hidden]; lora_a[s]: [num_slots, max_rank, hidden];
    out: [num_slices, num_tokens, max_rank]. Columns past a slot's rank and
    rows of base-only tokens are left untouched. With slice_ranks[s][slot], a run of
    tokens multiplied in place stops at the slice's own rank (the rows past it are zero
    in the slab, so the other ways, which multiply up to the slot's rank, agree).
    """
    order = segments.token_order
    for group in segments.cpu_plan.groups:
        r = group.rank
        if group.in_place:

            def runs_shrink(runs: tuple[Run, ...], r=r) -> None:
                for run in runs:
                    rows = slice(run.first_token, run.first_token + run.num_tokens)
                    for s, a in enumerate(lora_a):
                        rs = r if slice_ranks is None else min(r, slice_ranks[s][run.slot])
                        out[s, rows, :rs] = x[rows] @ a[run.slot, :rs].T

            _run_parts(runs_shrink, group.runs)
        elif group.padded is not None:
            _shrink_padded(x, lora_a, out, group.padded, r)
        else:
            for part in group.parts:
                rows = order[part.start : part.end]
                xs = x.index_select(0, rows)  # [n, hidden], tokens in segment order
                for s, a in enumerate(lora_a):
                    # [slots of the part, hidden, r]: a view of the slab
                    a_t = a[part.first_slot : part.end_slot, :r].transpose(1, 2)
                    t = _grouped_mm(xs, a_t, part)  # [n, r]
                    out[s, :, :r].index_copy_(0, rows, t.to(out.dtype))


def _shrink_padded(x, lora_a, out, padded: Padded, r: int) -> None:
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


def lora_expand_torch(
    t: torch.Tensor,
    lora_b: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    segments: Segments,
    scales: torch.Tensor,
    slice_ranks: list[list[int]] | None = None,
    host_scales: list[float] | None = None,
) -> None:
    """y[t, slice s] += scales[slot(t)] * t[s, t, :rank] @ lora_b[s][slot(t), :rank] for active t.

    t: [num_slices, num_tokens, max_rank]; lora_b[s]: [num_slots, max_rank, out_s];
    y: [num_tokens, sum(out_s)], the slices side by side (fused qkv / gate_up).
    host_scales: scales as a list, when the caller has it.
    """
    plan = segments.cpu_plan
    columns = _slice_columns(lora_b) if plan.bags is not None or plan.has_runs else None
    if host_scales is None and plan.has_runs:
        host_scales = scales.tolist()
    for group in plan.groups:
        if not group.in_place:
            continue

        def runs_expand(runs: tuple[Run, ...], r=group.rank) -> None:
            for run in runs:
                rows = slice(run.first_token, run.first_token + run.num_tokens)
                for s, b in enumerate(lora_b):
                    rs = r if slice_ranks is None else min(r, slice_ranks[s][run.slot])
                    ts = t[s, rows, :rs].to(b.dtype)
                    y[rows, columns[s]].addmm_(ts, b[run.slot, :rs], alpha=host_scales[run.slot])

        _run_parts(runs_expand, group.runs)
    for group in plan.groups:
        if group.padded is not None:
            _expand_padded(t, lora_b, y, group.padded, group.rank, scales, host_scales)
    if plan.bags is not None:
        _expand_bags(t, lora_b, y, plan.bags, scales, columns)


def _expand_padded(t, lora_b, y, padded: Padded, r: int, scales, host_scales) -> None:
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


def _expand_bags(t, lora_b, y, bags: Bags, scales, columns) -> None:
    """y[tok, slice s] += sum_j (scale * t[s, tok, j]) * B_s[slot, j, :] as embedding_bag sums."""
    num_slots, max_rank, _ = lora_b[0].shape
    slot_rows = lora_b[0].stride(0) // lora_b[0].stride(1)  # page_rank in a paged slab
    rows, weight_at = bags.index(slot_rows, max_rank)  # [num_elems] each, once per step
    elem_scale = scales.to(torch.float32).index_select(0, bags.elem_slot)
    num_rows = (num_slots - 1) * slot_rows + max_rank  # every row the stack's slots reach
    for s, b in enumerate(lora_b):
        weights = (t[s].reshape(-1).index_select(0, weight_at).to(torch.float32) * elem_scale).to(
            b.dtype
        )
        # [num_rows, out_s]: the stack's rows, slot s's from s * slot_rows
        table = b.as_strided((num_rows, b.shape[2]), (b.stride(1), b.stride(2)))
        delta = F.embedding_bag(rows, table, bags.offsets, mode="sum", per_sample_weights=weights)
        target = y if len(lora_b) == 1 else y[:, columns[s]]
        target.index_add_(0, bags.tokens, delta.to(y.dtype))


def _slice_columns(stacks: tuple[torch.Tensor, ...]) -> list[slice]:
    columns, col = [], 0
    for b in stacks:
        columns.append(slice(col, col + b.shape[2]))
        col += b.shape[2]
    return columns


def _run_parts(fn, parts) -> None:
    """fn(part) for every part; the parts write disjoint rows, so they run side by side."""
    global _pool
    if len(parts) == 1:
        fn(parts[0])
        return
    with _pool_lock:
        if _pool is None:
            _pool = _new_pool()
    # Inference and grad modes are per thread: the workers take the caller's.
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def call(part) -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            fn(part)

    for future in [_pool.submit(call, part) for part in parts]:
        future.result()


def _new_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        max_workers=torch.get_num_threads(),
        thread_name_prefix="lora",
        # One OpenMP thread per worker: each Python thread that enters a parallel
        # region gets its own OpenMP team, and extra teams oversubscribe the cores.
        initializer=torch.set_num_threads,
        initargs=(1,),
    )


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, part: Part) -> torch.Tensor:
    """[n, k] @ b[i] for the rows of slot first_slot + i -> [n, m]; b: [part's slots, k, m]."""
    if _is_aligned(a) and _is_aligned(b):
        return F.grouped_mm(a, b, offs=part.offs)
    out = a.new_empty(a.shape[0], b.shape[2])
    lo = 0
    for i, hi in enumerate(part.offs.tolist()):
        if lo < hi:
            torch.mm(a[lo:hi], b[i], out=out[lo:hi])
        lo = hi
    return out


def _is_aligned(t: torch.Tensor) -> bool:
    size = t.element_size()
    strides = [st for st in t.stride() if st != 1]
    return t.data_ptr() % _ALIGN_BYTES == 0 and all(st * size % _ALIGN_BYTES == 0 for st in strides)
