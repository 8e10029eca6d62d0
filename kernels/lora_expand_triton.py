"""Triton kernel for lora_expand: y[t, slice s] += scale[slot] * t_s[t] @ B_s[slot] over segments.

Grid: (m-blocks x column groups of the widest slice, segments, slices). One
launch writes every slice of a fused output (q/k/v or gate/up); each slice
has its own B stack and its own width, looked up from small tables. The
loop over the rank stops at the segment's own rank. A column group is n_chunks
blocks of BLOCK_N columns, written in turn by one program, which then loads the
segment, its tokens and t once for all of them; n_chunks is a tuned field
(kernels/lora_tuning.py), and on the H200 one block per program has won so far.

t may come as the shrink's split-K parts ([num_splits, num_slices, T, max_rank]); the
kernel adds them up as it loads them, in split order, so the sum is the one the shrink's
own sum kernel would have stored, with one launch fewer per layer.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kernels.device_tables import device_table
from kernels.lora_tuning import ExpandConfig, expand_config, rows_per_program
from kernels.segments import Segments

SINGLE_K_RANK = 64


@triton.jit
def _t_tile(t_rows, offs_k, mask_m, mask_k, num_splits, stride_tp, stride_tk):
    """[BLOCK_M, len(offs_k)] float32 of t: the split parts added up in split order (the
    shrink's sum kernel's result)."""
    at = t_rows + offs_k[None, :] * stride_tk
    mask = mask_m[:, None] & mask_k[None, :]
    tile = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    for p in range(1, num_splits):
        tile += tl.load(at + p * stride_tp, mask=mask, other=0.0)
    return tile


@triton.jit
def _lora_expand_kernel(
    t_ptr,  # [num_splits, num_slices, num_tokens, max_rank]: partial sums over hidden
    b_ptr_table,  # [num_slices] int64: data_ptr of each slice's [num_slots, max_rank, out_s]
    slot_rows,  # rows between two slots' first rows in every B (page_rank in the paged slab)
    slice_width_ptr,  # [num_slices] int32: out_s
    slice_offset_ptr,  # [num_slices] int32: first column of slice s in y
    y_ptr,  # [num_tokens, sum(out_s)]
    scales_ptr,  # [num_slots]
    token_order_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    seg_ranks_ptr,
    slice_ranks_ptr,  # [num_slices, num_slots] int32: each slice's own rank per slot
    num_slots,
    num_splits,
    stride_tp,
    stride_ts,
    stride_tm,
    stride_tk,
    stride_ym,
    stride_yn,
    MAX_RANK: tl.constexpr,
    NUM_N_GROUPS: tl.constexpr,
    N_CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SINGLE_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SLICE_RANKS: tl.constexpr,
):
    pid_mg = tl.program_id(0)
    seg = tl.program_id(1)
    slice_id = tl.program_id(2)
    pid_m = pid_mg // NUM_N_GROUPS
    # A program writes N_CHUNKS blocks of BLOCK_N columns: the segment's metadata, its
    # tokens and (for ranks up to one BLOCK_K) its t tile are loaded once for all of them.
    n_first = pid_mg % NUM_N_GROUPS * N_CHUNKS * BLOCK_N

    start = tl.load(seg_starts_ptr + seg)
    end = tl.load(seg_starts_ptr + seg + 1)
    width = tl.load(slice_width_ptr + slice_id)
    if start + pid_m * BLOCK_M >= end or n_first >= width:
        return
    rank = tl.load(seg_ranks_ptr + seg)
    slot = tl.load(seg_slots_ptr + seg).to(tl.int64)
    if HAS_SLICE_RANKS:  # the shrink wrote this slice's first columns only
        rank = tl.minimum(rank, tl.load(slice_ranks_ptr + slice_id * num_slots + slot))
    scale = tl.load(scales_ptr + slot).to(tl.float32)

    offs_m = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    tokens = tl.load(token_order_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    t_rows = t_ptr + slice_id * stride_ts + tokens[:, None] * stride_tm  # [BLOCK_M, 1]
    y_rows = y_ptr + tokens[:, None] * stride_ym  # [BLOCK_M, 1]
    column0 = tl.load(slice_offset_ptr + slice_id)

    b_ptr = tl.load(b_ptr_table + slice_id).to(tl.pointer_type(y_ptr.dtype.element_ty))
    # Slice s's rows are dense, `width` apart; its slots start slot_rows rows apart (they
    # may overlap: the slab's pages), the same in every slice (check_stacks).
    b_slot = b_ptr + slot * slot_rows * width

    offs_k = tl.arange(0, BLOCK_K)
    if SINGLE_K:  # every rank fits one tile: t [BLOCK_M, BLOCK_K] serves every chunk
        t_one = _t_tile(t_rows, offs_k, mask_m, offs_k < rank, num_splits, stride_tp, stride_tk)
    for c in range(N_CHUNKS):
        offs_n = n_first + c * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < width
        mask = mask_m[:, None] & mask_n[None, :]
        y = y_rows + (column0 + offs_n)[None, :] * stride_yn
        prev = tl.load(y, mask=mask, other=0.0)  # issued before the dot waits on B
        if SINGLE_K:
            b_tile = tl.load(
                b_slot + offs_k[:, None] * width + offs_n[None, :],
                mask=(offs_k < rank)[:, None] & mask_n[None, :],
                other=0.0,
            )  # [BLOCK_K, BLOCK_N]
            acc = tl.dot(t_one.to(b_tile.dtype), b_tile, input_precision=DOT_PRECISION)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, rank, BLOCK_K):
                mask_k = k0 + offs_k < rank
                t_tile = _t_tile(t_rows, k0 + offs_k, mask_m, mask_k, num_splits, stride_tp,
                                 stride_tk)  # fmt: skip
                b_tile = tl.load(
                    b_slot + (k0 + offs_k)[:, None] * width + offs_n[None, :],
                    mask=mask_k[:, None] & mask_n[None, :],
                    other=0.0,
                )  # [BLOCK_K, BLOCK_N]
                acc += tl.dot(t_tile.to(b_tile.dtype), b_tile, input_precision=DOT_PRECISION)
        tl.store(y, (prev.to(tl.float32) + scale * acc).to(y_ptr.dtype.element_ty), mask=mask)


def lora_expand_triton(
    t: torch.Tensor,
    lora_b: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    segments: Segments,
    scales: torch.Tensor,
    slice_ranks: torch.Tensor | None = None,
    *,
    config: ExpandConfig | None = None,
) -> None:
    """Launch the expand kernel; arguments already checked by kernels.lora_ops.

    t: [num_slices, T, max_rank], or [num_splits, num_slices, T, max_rank] parts to add up.
    config: the launch's tiles (None: kernels.lora_tuning's).
    """
    if segments.num_segments == 0:
        return
    parts = t if t.dim() == 4 else t.unsqueeze(0)
    config = config or expand_config(y.device, y.shape[0])
    max_rank = lora_b[0].shape[1]
    widths = [b.shape[2] for b in lora_b]
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    device = y.device
    b_table = device_table(tuple(b.data_ptr() for b in lora_b), torch.int64, device)
    width_table = device_table(tuple(widths), torch.int32, device)
    offset_table = device_table(tuple(offsets), torch.int32, device)
    block_m = rows_per_program(segments.max_segment_len, config.block_m)
    block_n = min(config.block_n, max(16, triton.next_power_of_2(max(widths))))
    n_chunks = max(1, min(config.n_chunks, triton.cdiv(max(widths), block_n)))
    num_n_groups = triton.cdiv(max(widths), block_n * n_chunks)
    # Ranks up to 64 (nearly every adapter) in one k tile, loaded once per program.
    single_k = max_rank <= SINGLE_K_RANK
    block_k = max(16, triton.next_power_of_2(max_rank)) if single_k else 32
    grid = (
        triton.cdiv(segments.max_segment_len, block_m) * num_n_groups,
        segments.num_segments,
        len(lora_b),
    )
    # Launch on y's GPU, whichever is current.
    with torch.cuda.device(device) if y.is_cuda else contextlib.nullcontext():
        _lora_expand_kernel[grid](
            parts,
            b_table,
            lora_b[0].stride(0) // lora_b[0].stride(1),
            width_table,
            offset_table,
            y,
            scales,
            segments.token_order,
            segments.seg_starts,
            segments.seg_slots,
            segments.seg_ranks,
            segments.seg_ranks if slice_ranks is None else slice_ranks,
            lora_b[0].shape[0],
            parts.shape[0],
            parts.stride(0),
            parts.stride(1),
            parts.stride(2),
            parts.stride(3),
            y.stride(0),
            y.stride(1),
            MAX_RANK=max_rank,
            NUM_N_GROUPS=num_n_groups,
            N_CHUNKS=n_chunks,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            SINGLE_K=single_k,
            DOT_PRECISION="ieee" if y.dtype == torch.float32 else "tf32",
            HAS_SLICE_RANKS=slice_ranks is not None,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
