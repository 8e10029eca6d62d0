"""The two LoRA ops and their one dispatch point: Triton on CUDA, grouped torch matmuls elsewhere.

A LoRA layer is  y += scale * (x @ A.T) @ B.T,  split in two so that fused
projections share one shrink buffer:

    lora_shrink:  t[s, tok] = x[tok] @ A_s[slot(tok)].T                      (no scale)
    lora_expand:  y[tok, slice s] += scale[slot(tok)] * t[s, tok] @ B_s[slot(tok)]

Slab layout: A_s is [num_slots, max_rank, in] and B_s is [num_slots, max_rank, out_s]
(B stored transposed), so a rank-r adapter's weights are the first r rows of
its slot in both, one contiguous block each. Rows are dense; slots may overlap:
the adapter slab's stacks are views in which slot s starts page_rank rows after
slot s - 1 (stride(0) == page_rank * width), and every backend reads a slot by
the stacks' strides, rows [:rank] only (kernels/lora_checks.py: check_stacks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels import lora_native
from kernels.lora_checks import (
    ACTIVATION_DTYPES,
    as_slices,
    check_segments,
    check_shape,
    check_stacks,
    check_tensor,
)
from kernels.segments import Segments

FLOAT_DTYPES = (*ACTIVATION_DTYPES, torch.float64)


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor | Sequence[torch.Tensor],
    out: torch.Tensor,
    segments: Segments,
    slice_ranks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Project each token onto its adapter's rank space.

    Semantics:  out[t] = x[t] @ lora_a[slot(t)].T      (the scale is applied in lora_expand)

    Tokens are visited segment by segment, so an adapter's A is read once for
    a whole run of tokens. Tokens in slot -1 use the base model alone; their
    rows of `out` are left untouched, as are columns past a slot's rank.

    x: [num_tokens, hidden]; lora_a: [num_slots, max_rank, hidden], or a
    sequence of them (one per fused slice); out: float32, [num_tokens, max_rank],
    or [num_slices, num_tokens, max_rank] for a sequence. Returns out.

    slice_ranks: int32 [num_slices, num_slots], each slice's own rank in each slot, at
    most the slot's (rank_pattern; 0 where the adapter leaves the module out). The slab's
    rows past it are zero; the kernels then read and write only that many columns, so the
    expand must be given the same table.
    """
    slices = as_slices("lora_a", lora_a)
    check_tensor("x", x, dim=2, dtypes=ACTIVATION_DTYPES)
    num_tokens, hidden = x.shape
    check_stacks("lora_a", slices, dtype=x.dtype, device=x.device)
    num_slots, max_rank, _ = slices[0].shape
    for i, a in enumerate(slices):
        if a.shape[2] != hidden:
            label = "lora_a" if len(slices) == 1 else f"lora_a[{i}]"
            raise ValueError(f"{label}: expected hidden size {hidden} (from x), got {a.shape[2]}")
    out3 = _check_rank_buffer("out", out, slices, lora_a, num_tokens, max_rank, x.device)
    if out.dtype != torch.float32:
        raise ValueError(f"out: expected dtype float32, got {out.dtype}")
    check_segments(
        segments, num_tokens=num_tokens, num_slots=num_slots, max_rank=max_rank, device=x.device
    )
    _check_slice_ranks(slice_ranks, len(slices), num_slots, x.device)
    lora_shrink_planned(x, slices, out3, segments, slice_ranks, _host(x, slice_ranks))
    return out


def lora_shrink_planned(x, lora_a, out, segments, slice_ranks=None, host_ranks=None) -> None:
    """lora_shrink without checks: lora_a a tuple of stacks, out [num_slices, T, max_rank].

    host_ranks: slice_ranks as lists (the CPU path loops over them; unused on CUDA).
    """
    if x.is_cuda:
        from kernels.lora_shrink_triton import lora_shrink_triton

        lora_shrink_triton(x, lora_a, out, segments, slice_ranks)
    else:
        from kernels.lora_torch import lora_shrink_torch

        lora_shrink_torch(x, lora_a, out, segments, host_ranks)


def lora_expand(
    t: torch.Tensor,
    lora_b: torch.Tensor | Sequence[torch.Tensor],
    y: torch.Tensor,
    segments: Segments,
    scales: torch.Tensor,
    slice_ranks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Add each token's scaled LoRA update to the base output, in place.

    Semantics:  y[t] += scales[slot(t)] * t[t] @ lora_b[slot(t)]      (lora_b is B.T per slot)

    With a sequence of B stacks, slice s writes columns
    [sum(out_0..out_{s-1}), +out_s) of y from t[s], all in one launch. Rows of
    tokens in slot -1 are left untouched.

    t: [num_tokens, max_rank] (or [num_slices, num_tokens, max_rank]), float32
    or y's dtype; lora_b: [num_slots, max_rank, out_s], y's dtype;
    y: [num_tokens, sum(out_s)]; scales: [num_slots]; slice_ranks: as lora_shrink's, the
    same table. Returns y.
    """
    slices = as_slices("lora_b", lora_b)
    check_tensor("y", y, dim=2, dtypes=ACTIVATION_DTYPES)
    num_tokens, width = y.shape
    check_stacks("lora_b", slices, dtype=y.dtype, device=y.device)
    num_slots, max_rank, _ = slices[0].shape
    total = sum(b.shape[2] for b in slices)
    if total != width:
        raise ValueError(
            f"y: expected {total} columns (the sum of the lora_b slice widths), got {width}"
        )
    t3 = _check_rank_buffer("t", t, slices, lora_b, num_tokens, max_rank, y.device)
    if t.dtype not in (torch.float32, y.dtype):
        raise ValueError(f"t: expected dtype float32 or {y.dtype} (y's), got {t.dtype}")
    check_tensor("scales", scales, dim=1, dtypes=FLOAT_DTYPES, device=y.device)
    check_shape("scales", scales, (num_slots,))
    check_segments(
        segments, num_tokens=num_tokens, num_slots=num_slots, max_rank=max_rank, device=y.device
    )
    _check_slice_ranks(slice_ranks, len(slices), num_slots, y.device)
    lora_expand_planned(t3, slices, y, segments, scales, slice_ranks, _host(y, slice_ranks))
    return y


def lora_expand_planned(
    t, lora_b, y, segments, scales, slice_ranks=None, host_ranks=None, host_scales=None
) -> None:
    """lora_expand without checks: lora_b a tuple of stacks, t [num_slices, T, max_rank].

    host_ranks, host_scales: slice_ranks and scales as lists, for the CPU path.
    """
    if y.is_cuda:
        from kernels.lora_expand_triton import lora_expand_triton

        lora_expand_triton(t, lora_b, y, segments, scales, slice_ranks)
    else:
        from kernels.lora_torch import lora_expand_torch

        lora_expand_torch(t, lora_b, y, segments, scales, host_ranks, host_scales)


def lora_apply_planned(
    x, lora_a, lora_b, y, segments, scales, max_rank, slice_ranks=None, host_ranks=None,
    host_scales=None,
) -> None:  # fmt: skip
    """lora_shrink_planned then lora_expand_planned:
    y[t, slice s] += scale[slot(t)] * (x[t] @ A_s[slot(t)].T) @ B_s[slot(t)].

    x: [T, hidden]; lora_a, lora_b: tuples of stacks, one per fused slice; y: [T, sum(out_s)].
    On the CPU a step with no long runs of one adapter's tokens (a decode step, or prefills
    of several short prompts per adapter) runs in the compiled kernel where it builds (in
    float32), measured faster there than the torch ways; failing that, a step whose rank
    groups all run padded runs the two fused, with no shrink buffer; otherwise through a
    float32 [num_slices, T, max_rank] one. On CUDA the buffer holds the shrink's split-K
    parts, which the expand adds up.
    """
    plan = segments.cpu_plan
    if _native_ran(x, lora_a, lora_b, y, segments, scales):
        return
    if not x.is_cuda and plan is not None and plan.all_padded:
        from kernels.lora_padded_torch import lora_apply_padded_torch

        lora_apply_padded_torch(x, lora_a, lora_b, y, segments, scales, host_scales)
        return
    if x.is_cuda:  # the shrink's split-K parts go to the expand, which adds them up
        from kernels.lora_expand_triton import lora_expand_triton
        from kernels.lora_shrink_triton import lora_shrink_parts

        parts = lora_shrink_parts(x, lora_a, segments, slice_ranks)
        lora_expand_triton(parts, lora_b, y, segments, scales, slice_ranks)
        return
    # Uninitialised: the expand reads only active rows and columns below each rank.
    t = torch.empty(len(lora_a), x.shape[0], max_rank, dtype=torch.float32, device=x.device)
    lora_shrink_planned(x, lora_a, t, segments, slice_ranks, host_ranks)
    lora_expand_planned(t, lora_b, y, segments, scales, slice_ranks, host_ranks, host_scales)


def _native_ran(x, lora_a, lora_b, y, segments: Segments, scales) -> bool:
    """Whether the compiled CPU kernel ran the step: one with no runs in place, on the CPU,
    in float32, where the kernel builds."""
    plan = segments.cpu_plan
    if x.is_cuda or plan is None or plan.token_ranks is None or not lora_native.available():
        return False
    # The kernel reads raw memory: slots and ranks in the stacks' bounds, one row per token.
    stacks = lora_a[0] if lora_a else None
    if stacks is None or stacks.dim() != 3 or x.shape[0] != segments.num_tokens:
        return False
    if segments.num_slots != stacks.shape[0] or segments.max_rank > stacks.shape[1]:
        return False
    order, slots = segments.token_order, segments.token_slots
    ranks, checked = plan.token_ranks, plan.kernel_indices
    return lora_native.lora_apply_rows(x, lora_a, lora_b, y, order, slots, ranks, scales, checked)


def _check_rank_buffer(name, buf, slices, given, num_tokens, max_rank, device) -> torch.Tensor:
    """The [num_slices, num_tokens, max_rank] view of a shrink output / expand input."""
    if isinstance(given, torch.Tensor):
        check_tensor(name, buf, dim=2, device=device)
        check_shape(name, buf, (num_tokens, max_rank))
        return buf.unsqueeze(0)
    check_tensor(name, buf, dim=3, device=device)
    check_shape(name, buf, (len(slices), num_tokens, max_rank))
    return buf


def _check_slice_ranks(ranks, num_slices: int, num_slots: int, device) -> None:
    if ranks is None:
        return
    check_tensor("slice_ranks", ranks, dim=2, dtypes=(torch.int32,), device=device)
    check_shape("slice_ranks", ranks, (num_slices, num_slots))
    if not ranks.is_contiguous():
        raise ValueError("slice_ranks: expected a contiguous tensor (the kernels index it flat)")


def _host(x: torch.Tensor, ranks: torch.Tensor | None) -> list[list[int]] | None:
    """The table as lists, for the CPU path's per-run loops (a few dozen ints); CUDA reads
    it on the device."""
    return None if ranks is None or x.is_cuda else ranks.tolist()
