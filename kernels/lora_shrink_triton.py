"""Triton kernel for lora_shrink: out[s, t] = x[t] @ A_s[slot(t)].T over adapter segments.

Grid: (m-blocks x n-blocks of the longest segment x k-splits, segments, slices). A
program loads its segment's A tile once for BLOCK_M tokens; programs past
their segment's length or past its rank return at once, so a rank-8 adapter
in a rank-64 slab reads and multiplies 8 rows, not 64.

Split-K: a decode batch has one or a few tokens per segment, so without it a handful of
programs each stream a whole [rank, hidden] A sequentially and the GPU idles (a 1B model's
down_proj at batch 32: 32 programs of 128 serial steps). With few programs, each split of
hidden writes its partial sum to a scratch buffer, and a second kernel adds the splits up in
a fixed order (deterministic, unlike atomics) and stores them as the one-split kernel would.
A LoRA layer skips that kernel: `lora_shrink_parts` hands the parts to the expand, which adds
them up in the same order as it loads them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.device_info import multiprocessors
from kernels.device_tables import device_table
from kernels.lora_tuning import ShrinkConfig, rows_per_program, shrink_config
from kernels.segments import Segments

# No split shorter than MIN_SPLIT_K elements of hidden, and at most MAX_SPLITS of them.
MIN_SPLIT_K, MAX_SPLITS = 256, 32


@triton.jit
def _segment(seg_starts_ptr, seg_slots_ptr, seg_ranks_ptr, slice_ranks_ptr, seg, slice_id,
             num_slots, HAS_SLICE_RANKS: tl.constexpr):  # fmt: skip
    """(start, end, rank, slot) of segment seg for slice slice_id."""
    start = tl.load(seg_starts_ptr + seg)
    end = tl.load(seg_starts_ptr + seg + 1)
    rank = tl.load(seg_ranks_ptr + seg)
    slot = tl.load(seg_slots_ptr + seg).to(tl.int64)
    if HAS_SLICE_RANKS:  # a module of a lower rank than its slot's (rank_pattern) costs its own
        rank = tl.minimum(rank, tl.load(slice_ranks_ptr + slice_id * num_slots + slot))
    return start, end, rank, slot


@triton.jit
def _lora_shrink_kernel(
    x_ptr,  # [num_tokens, hidden]
    a_ptr_table,  # [num_slices] int64: data_ptr of each slice's [num_slots, max_rank, hidden]
    stride_as,  # A's stride between slots (page_rank * hidden in the paged slab)
    stride_ar,  # A's stride between rows (hidden: rows are dense)
    out_ptr,  # [num_slices, num_tokens, max_rank] float32
    token_order_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    seg_ranks_ptr,
    slice_ranks_ptr,  # [num_slices, num_slots] int32: each slice's own rank per slot
    num_slots,
    hidden,
    k_per_split,  # elements of hidden per split, a multiple of BLOCK_K (hidden: no split)
    stride_xm,
    stride_xk,
    stride_op,  # out's stride between splits (a scratch [splits, ...] buffer when split)
    stride_os,
    stride_om,
    stride_on,
    num_splits,
    MAX_RANK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SLICE_RANKS: tl.constexpr,
):
    pid_mnk = tl.program_id(0)
    seg = tl.program_id(1)
    slice_id = tl.program_id(2)
    num_n_blocks: tl.constexpr = (MAX_RANK + BLOCK_N - 1) // BLOCK_N
    pid_k = pid_mnk % num_splits
    pid_m = pid_mnk // num_splits // num_n_blocks
    pid_n = pid_mnk // num_splits % num_n_blocks

    start, end, rank, slot = _segment(seg_starts_ptr, seg_slots_ptr, seg_ranks_ptr,
                                      slice_ranks_ptr, seg, slice_id, num_slots, HAS_SLICE_RANKS)  # fmt: skip
    if start + pid_m * BLOCK_M >= end or pid_n * BLOCK_N >= rank:
        return

    offs_m = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    tokens = tl.load(token_order_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < rank

    # A slices share one shape and strides (kernels/lora_checks.py: check_stacks); slots
    # may overlap (the slab's pages), so a slot's rows start where its stride says.
    a_ptr = tl.load(a_ptr_table + slice_id).to(tl.pointer_type(x_ptr.dtype.element_ty))
    a_slot = a_ptr + slot * stride_as

    # float32 accumulator: bf16 partial sums over thousands of terms drift
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(hidden, k_start + k_per_split)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        x_tile = tl.load(
            x_ptr + tokens[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        a_tile = tl.load(
            a_slot + offs_n[None, :] * stride_ar + offs_k[:, None],
            mask=mask_k[:, None] & mask_n[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(x_tile, a_tile, input_precision=DOT_PRECISION)

    out = (out_ptr + pid_k * stride_op + slice_id * stride_os + tokens[:, None] * stride_om
           + offs_n[None, :] * stride_on)  # fmt: skip
    tl.store(out, acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _lora_shrink_sum_kernel(
    part_ptr,  # [num_splits, num_slices, num_tokens, max_rank] float32: the splits' sums
    out_ptr,  # [num_slices, num_tokens, max_rank] float32
    token_order_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    seg_ranks_ptr,
    slice_ranks_ptr,
    num_slots,
    stride_pp,
    stride_ps,
    stride_pm,
    stride_os,
    stride_om,
    stride_on,
    num_splits,
    MAX_RANK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SLICE_RANKS: tl.constexpr,
):
    """out[s, t, :rank] = sum over splits of part[k, s, t, :rank], for the shrink's live tiles."""
    pid_mn = tl.program_id(0)
    seg = tl.program_id(1)
    slice_id = tl.program_id(2)
    num_n_blocks: tl.constexpr = (MAX_RANK + BLOCK_N - 1) // BLOCK_N
    pid_m = pid_mn // num_n_blocks
    pid_n = pid_mn % num_n_blocks
    start, end, rank, _slot = _segment(seg_starts_ptr, seg_slots_ptr, seg_ranks_ptr,
                                       slice_ranks_ptr, seg, slice_id, num_slots, HAS_SLICE_RANKS)  # fmt: skip
    if start + pid_m * BLOCK_M >= end or pid_n * BLOCK_N >= rank:
        return
    offs_m = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    tokens = tl.load(token_order_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = mask_m[:, None] & (offs_n < rank)[None, :]
    part = part_ptr + slice_id * stride_ps + tokens[:, None] * stride_pm + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(num_splits):  # in order: the same sum on every run
        acc += tl.load(part + k * stride_pp, mask=mask, other=0.0)
    out = out_ptr + slice_id * stride_os + tokens[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out, acc, mask=mask)


def lora_shrink_triton(
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    segments: Segments,
    slice_ranks: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    config: ShrinkConfig | None = None,
) -> None:
    """Launch the shrink kernel; arguments already checked by kernels.lora_ops.

    num_splits: how many parts hidden is summed in (None: as many as fill the GPU, 1 on
    the CPU's interpreter). config: the launch's tiles (None: kernels.lora_tuning's).
    """
    if segments.num_segments == 0:
        return
    plan = _plan(x, lora_a, segments, num_splits, config)
    # [num_splits, num_slices, T, max_rank] scratch when split; uninitialised: the sum reads
    # only what the splits wrote.
    part = out if plan.num_splits == 1 else out.new_empty((plan.num_splits, *out.shape))
    # The first kernel writes where it was given: out itself (any strides), or the scratch
    # (its own, contiguous strides), which the sum kernel then reads into out.
    strides = (0, *out.stride()) if plan.num_splits == 1 else part.stride()
    with _on(x):
        _launch(x, lora_a, part, strides, segments, slice_ranks, plan)
        if plan.num_splits > 1:
            ranks = segments.seg_ranks if slice_ranks is None else slice_ranks
            _lora_shrink_sum_kernel[(plan.tiles, segments.num_segments, len(lora_a))](
                part, out, segments.token_order, segments.seg_starts, segments.seg_slots,
                segments.seg_ranks, ranks, lora_a[0].shape[0], part.stride(0), part.stride(1),
                part.stride(2), out.stride(0), out.stride(1), out.stride(2), plan.num_splits,
                MAX_RANK=lora_a[0].shape[1], BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                HAS_SLICE_RANKS=slice_ranks is not None,
            )  # fmt: skip


def lora_shrink_parts(
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    segments: Segments,
    slice_ranks: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    config: ShrinkConfig | None = None,
) -> torch.Tensor:
    """parts[k, s, t] = x[t, split k] @ A_s[slot(t)][:, split k].T: lora_shrink's out, left
    as float32 [num_splits, num_slices, T, max_rank] partial sums over hidden for the expand
    to add up (one launch fewer). Rows and columns lora_shrink leaves untouched are
    uninitialised."""
    if segments.num_segments == 0:  # nothing to project: one (unread) part
        shape = (1, len(lora_a), x.shape[0], lora_a[0].shape[1])
        return torch.empty(shape, dtype=torch.float32, device=x.device)
    plan = _plan(x, lora_a, segments, num_splits, config)
    shape = (plan.num_splits, len(lora_a), x.shape[0], lora_a[0].shape[1])
    parts = torch.empty(shape, dtype=torch.float32, device=x.device)
    with _on(x):
        _launch(x, lora_a, parts, parts.stride(), segments, slice_ranks, plan)
    return parts


@dataclass(frozen=True)
class _Plan:
    config: ShrinkConfig
    block_m: int
    block_n: int
    block_k: int
    tiles: int  # m-blocks x n-blocks of one segment's longest run
    num_splits: int
    k_per_split: int


def _plan(x, lora_a, segments, num_splits, config) -> _Plan:
    hidden, max_rank = x.shape[1], lora_a[0].shape[1]
    config = config or shrink_config(x.device, x.shape[0])
    block_m = rows_per_program(segments.max_segment_len, config.block_m)
    block_n = max(16, min(64, triton.next_power_of_2(max_rank)))
    block_k = min(config.block_k, max(16, triton.next_power_of_2(hidden)))
    tiles = triton.cdiv(segments.max_segment_len, block_m) * triton.cdiv(max_rank, block_n)
    if num_splits is None:
        programs = tiles * segments.num_segments * len(lora_a)
        num_splits = _splits(programs, hidden, x.device, config.programs_per_sm)
    k_per_split = triton.cdiv(triton.cdiv(hidden, num_splits), block_k) * block_k
    num_splits = triton.cdiv(hidden, k_per_split)  # no empty split
    return _Plan(config, block_m, block_n, block_k, tiles, num_splits, k_per_split)


def _launch(x, lora_a, dest, strides, segments, slice_ranks, plan: _Plan) -> None:
    """The shrink kernel writing split k's sums at dest + k * strides[0]."""
    a_table = device_table(tuple(a.data_ptr() for a in lora_a), torch.int64, x.device)
    grid = (plan.tiles * plan.num_splits, segments.num_segments, len(lora_a))
    _lora_shrink_kernel[grid](
        x, a_table, lora_a[0].stride(0), lora_a[0].stride(1), dest, segments.token_order, segments.seg_starts, segments.seg_slots,
        segments.seg_ranks, segments.seg_ranks if slice_ranks is None else slice_ranks,
        lora_a[0].shape[0], x.shape[1], plan.k_per_split, x.stride(0), x.stride(1), *strides,
        plan.num_splits, MAX_RANK=lora_a[0].shape[1], BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        HAS_SLICE_RANKS=slice_ranks is not None,
        num_warps=plan.config.num_warps, num_stages=plan.config.num_stages,
    )  # fmt: skip


def _on(x: torch.Tensor):
    """Launch on x's GPU, whichever is current."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _splits(programs: int, hidden: int, device: torch.device, programs_per_sm: int) -> int:
    """Splits of hidden that bring the grid to programs_per_sm programs per multiprocessor."""
    if device.type != "cuda":
        return 1  # the interpreter runs programs one by one: splitting only adds work
    want = triton.cdiv(programs_per_sm * multiprocessors(device), max(programs, 1))
    return max(1, min(want, hidden // MIN_SPLIT_K, MAX_SPLITS))
