"""Triton kernel for lora_expand: y[t, slice s] += scale[slot] * t_s[t] @ B_s[slot] over segments.

Grid: (m-blocks x n-blocks of the widest slice, segments, slices). One
launch writes every slice of a fused output (q/k/v or gate/up); each slice
has its own B stack and its own width, looked up from small tables. The
loop over the rank stops at the segment's own rank.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kernels.device_tables import device_table
from kernels.segments import Segments


@triton.jit
def _lora_expand_kernel(
    t_ptr,  # [num_slices, num_tokens, max_rank]
    b_ptr_table,  # [num_slices] int64: data_ptr of each slice's [num_slots, max_rank, out_s]
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
    stride_ts,
    stride_tm,
    stride_tk,
    stride_ym,
    stride_yn,
    MAX_RANK: tl.constexpr,
    NUM_N_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SLICE_RANKS: tl.constexpr,
):
    pid_mn = tl.program_id(0)
    seg = tl.program_id(1)
    slice_id = tl.program_id(2)
    pid_m = pid_mn // NUM_N_BLOCKS
    pid_n = pid_mn % NUM_N_BLOCKS

    start = tl.load(seg_starts_ptr + seg)
    end = tl.load(seg_starts_ptr + seg + 1)
    width = tl.load(slice_width_ptr + slice_id)
    if start + pid_m * BLOCK_M >= end or pid_n * BLOCK_N >= width:
        return
    rank = tl.load(seg_ranks_ptr + seg)
    slot = tl.load(seg_slots_ptr + seg).to(tl.int64)
    if HAS_SLICE_RANKS:  # the shrink wrote this slice's first columns only
        rank = tl.minimum(rank, tl.load(slice_ranks_ptr + slice_id * num_slots + slot))
    scale = tl.load(scales_ptr + slot).to(tl.float32)

    offs_m = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    tokens = tl.load(token_order_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < width

    b_ptr = tl.load(b_ptr_table + slice_id).to(tl.pointer_type(y_ptr.dtype.element_ty))
    b_slot = b_ptr + slot * MAX_RANK * width  # slice s is contiguous [num_slots, max_rank, width]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, rank, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < rank
        t_tile = tl.load(
            t_ptr
            + slice_id * stride_ts
            + tokens[:, None] * stride_tm
            + offs_k[None, :] * stride_tk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        b_tile = tl.load(
            b_slot + offs_k[:, None] * width + offs_n[None, :],
            mask=mask_k[:, None] & mask_n[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(t_tile.to(b_tile.dtype), b_tile, input_precision=DOT_PRECISION)

    column = tl.load(slice_offset_ptr + slice_id) + offs_n
    y = y_ptr + tokens[:, None] * stride_ym + column[None, :] * stride_yn
    mask = mask_m[:, None] & mask_n[None, :]
    prev = tl.load(y, mask=mask, other=0.0)
    tl.store(y, (prev.to(tl.float32) + scale * acc).to(y_ptr.dtype.element_ty), mask=mask)


def lora_expand_triton(
    t: torch.Tensor,
    lora_b: tuple[torch.Tensor, ...],
    y: torch.Tensor,
    segments: Segments,
    scales: torch.Tensor,
    slice_ranks: torch.Tensor | None = None,
) -> None:
    """Launch the expand kernel; arguments already checked by kernels.lora_ops."""
    if segments.num_segments == 0:
        return
    max_rank = lora_b[0].shape[1]
    widths = [b.shape[2] for b in lora_b]
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    device = y.device
    b_table = device_table(tuple(b.data_ptr() for b in lora_b), torch.int64, device)
    width_table = device_table(tuple(widths), torch.int32, device)
    offset_table = device_table(tuple(offsets), torch.int32, device)
    block_m = 16 if segments.max_segment_len <= 16 else 32 if segments.max_segment_len <= 32 else 64
    block_n = min(128, max(16, triton.next_power_of_2(max(widths))))
    block_k = 16 if max_rank <= 16 else 32
    num_n_blocks = triton.cdiv(max(widths), block_n)
    grid = (
        triton.cdiv(segments.max_segment_len, block_m) * num_n_blocks,
        segments.num_segments,
        len(lora_b),
    )
    # Launch on y's GPU, whichever is current.
    with torch.cuda.device(device) if y.is_cuda else contextlib.nullcontext():
        _lora_expand_kernel[grid](
            t,
            b_table,
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
            t.stride(0),
            t.stride(1),
            t.stride(2),
            y.stride(0),
            y.stride(1),
            MAX_RANK=max_rank,
            NUM_N_BLOCKS=num_n_blocks,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            DOT_PRECISION="ieee" if y.dtype == torch.float32 else "tf32",
            HAS_SLICE_RANKS=slice_ranks is not None,
        )
