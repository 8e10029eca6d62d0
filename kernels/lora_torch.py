"""The LoRA ops in plain torch: the path the CPU (and the CPU demo) runs.

A rank group (see kernels/cpu_plan.py for which way when) runs in place, one
matmul per long run of adjacent tokens; or padded, its shrink and expand each
one `bmm` per slice over a range of the slab (kernels/lora_padded_torch.py); or
grouped, its shrink `grouped_mm` over the slab and its expand one `embedding_bag` with
B's rows as the table. There is never a copy of adapter weights, and a rank-r adapter reads
only the first r rows of its slot (`A[:, :r]` is a strided view). Every way
works on the slab's paged stacks, whose slots overlap (kernels/lora_checks.py:
check_stacks): they index slots by the stacks' strides, never by their shape.

`grouped_mm` needs 16-byte aligned strides. Real models' widths are multiples
of 64; for any other width the same arithmetic runs as a loop over segments.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from kernels.cpu_plan import Bags, Part, Run
from kernels.lora_padded_torch import expand_padded, shrink_padded
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
            shrink_padded(x, lora_a, out, group.padded, r)
        else:
            for part in group.parts:
                rows = order[part.start : part.end]
                xs = x.index_select(0, rows)  # [n, hidden], tokens in segment order
                for s, a in enumerate(lora_a):
                    # [slots of the part, hidden, r]: a view of the slab
                    a_t = a[part.first_slot : part.end_slot, :r].transpose(1, 2)
                    t = _grouped_mm(xs, a_t, part)  # [n, r]
                    out[s, :, :r].index_copy_(0, rows, t.to(out.dtype))


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
            expand_padded(t, lora_b, y, group.padded, group.rank, scales, host_scales)
    if plan.bags is not None:
        _expand_bags(t, lora_b, y, plan.bags, scales, columns)


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
