"""Triton kernel for expert_linear: each group's expert linear plus its adapter's LoRA update.

Grid: (row tiles, column tiles). A row tile is BLOCK_M sorted rows of one group (the table is
built on the host: kernels/expert_groups.py); a column tile is BLOCK_N columns of one LoRA
slice (gate or up; the whole output without LoRA), so a program's columns have one B stack.
A program computes

    acc = x[rows] @ W[e][cols].T                 (K loop over in; FP8: times w_scale[e][cols])
    acc += scale[s] * (x[rows] @ A_i[e, s, :r].T) @ B_i[e, s, :r, cols]    if the group has a slot

with float32 accumulators, and stores acc once. A group without an adapter skips the second
K loop and reads no A or B; one with rank r reads rows [:r] of its slot (BLOCK_R covers
max_rank, masked by r). The shrink is recomputed by each column tile of a group: r / BLOCK_N
more multiplies than the base, traded for no intermediate buffer and one launch.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kernels.device_tables import device_table
from kernels.expert_groups import ExpertGroups
from kernels.fp8 import FP8_DTYPE

MAX_BLOCK_N, MAX_BLOCK_K = 64, 64


@triton.jit
def _expert_linear_kernel(
    x_ptr,  # [N, in], rows sorted by (expert, slot)
    w_ptr,  # [E, out, in], x's dtype or float8_e4m3fn
    w_scale_ptr,  # [E, out] float32 (read only when IS_FP8)
    y_ptr,  # [N, out], x's dtype
    a_ptr_table,  # [num_slices] int64: data_ptr of each A stack [E, num_slots, max_rank, in]
    b_ptr_table,  # [num_slices] int64: data_ptr of each B stack [E, num_slots, max_rank, out_i]
    scales_ptr,  # [num_slots] float32
    tile_groups_ptr,  # [num_tiles] int32: each row tile's group
    tile_rows_ptr,  # [num_tiles] int32: its first row
    col_slices_ptr,  # [num_col_tiles] int32: each column tile's slice
    col_starts_ptr,  # [num_col_tiles] int32: its first column within the slice
    slice_width_ptr,  # [num_slices] int32: out_i
    slice_offset_ptr,  # [num_slices] int32: the slice's first column in y
    group_experts_ptr,
    group_slots_ptr,
    group_starts_ptr,
    group_lengths_ptr,
    group_ranks_ptr,
    in_features,
    stride_xm,
    stride_xk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_ym,
    stride_yn,
    a_expert_rows,  # rows between two experts' first rows in every A (rows are `in` apart)
    a_slot_rows,  # rows between two slots' first rows (page_rank in the paged slab)
    b_expert_rows,  # the same in every B (rows are out_i apart)
    b_slot_rows,
    HAS_LORA: tl.constexpr,
    IS_FP8: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    col_tile = tl.program_id(1)
    group = tl.load(tile_groups_ptr + tile)
    end = tl.load(group_starts_ptr + group) + tl.load(group_lengths_ptr + group)
    expert = tl.load(group_experts_ptr + group).to(tl.int64)  # E * out * in may pass 2**31
    offs_m = tl.load(tile_rows_ptr + tile) + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    slice_id = tl.load(col_slices_ptr + col_tile)
    width = tl.load(slice_width_ptr + slice_id)
    offs_n = tl.load(col_starts_ptr + col_tile) + tl.arange(0, BLOCK_N)  # within the slice
    mask_n = offs_n < width
    cols = tl.load(slice_offset_ptr + slice_id) + offs_n  # of y, and rows of W[e]
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + expert * stride_we + cols.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]

    # float32 accumulator: bf16 partial sums over thousands of terms drift
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k = k0 + offs_k
        mask_k = k < in_features
        x_tile = tl.load(
            x_rows + k[None, :] * stride_xk, mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )  # [BLOCK_M, BLOCK_K]
        # Loaded as stored, each output's inputs contiguous; FP8 widened in registers (e4m3
        # values are exact in x's dtype).
        w_tile = tl.load(
            w_rows + k[None, :] * stride_wk, mask=mask_n[:, None] & mask_k[None, :], other=0.0
        )  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x_tile, tl.trans(w_tile.to(x_ptr.dtype.element_ty)),
                      input_precision=DOT_PRECISION)  # fmt: skip
    if IS_FP8:  # per output channel: once per output, after the sum
        w_scale = tl.load(w_scale_ptr + expert * stride_se + cols * stride_sn, mask=mask_n,
                          other=0.0)  # fmt: skip
        acc *= w_scale[None, :]

    if HAS_LORA:
        slot = tl.load(group_slots_ptr + group)
        rank = tl.load(group_ranks_ptr + group)
        if (slot >= 0) & (rank > 0):
            # (A new name: a compiled `if` may not change a variable's type.)
            slot64 = slot.to(tl.int64)
            offs_r = tl.arange(0, BLOCK_R)
            mask_r = offs_r < rank
            # Slots and experts are whole rows apart, and may overlap (the slab's pages):
            # a slot's rows start where the strides say, and only rows [:rank] are read.
            a_ptr = tl.load(a_ptr_table + slice_id).to(tl.pointer_type(x_ptr.dtype.element_ty))
            a_slot = a_ptr + (expert * a_expert_rows + slot64 * a_slot_rows) * in_features
            t = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)  # x[rows] @ A[e, s, :r].T
            for k0 in range(0, in_features, BLOCK_K):
                k = k0 + offs_k
                mask_k = k < in_features
                x_tile = tl.load(
                    x_rows + k[None, :] * stride_xk,
                    mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0,
                )  # [BLOCK_M, BLOCK_K]
                a_tile = tl.load(
                    a_slot + offs_r[None, :] * in_features + k[:, None],
                    mask=mask_k[:, None] & mask_r[None, :],
                    other=0.0,
                )  # [BLOCK_K, BLOCK_R]
                t += tl.dot(x_tile, a_tile, input_precision=DOT_PRECISION)
            b_ptr = tl.load(b_ptr_table + slice_id).to(tl.pointer_type(x_ptr.dtype.element_ty))
            b_slot = b_ptr + (expert * b_expert_rows + slot64 * b_slot_rows) * width
            b_tile = tl.load(
                b_slot + offs_r[:, None] * width + offs_n[None, :],
                mask=mask_r[:, None] & mask_n[None, :],
                other=0.0,
            )  # [BLOCK_R, BLOCK_N]
            scale = tl.load(scales_ptr + slot64)
            acc += scale * tl.dot(t.to(b_tile.dtype), b_tile, input_precision=DOT_PRECISION)

    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + cols[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def expert_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    w_scale: torch.Tensor | None,
    lora_a: tuple[torch.Tensor, ...] | None,
    lora_b: tuple[torch.Tensor, ...] | None,
    scales: torch.Tensor | None,
    groups: ExpertGroups,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """Launch the kernel; arguments as kernels.expert_linear takes them, lora_a and lora_b
    tuples or None. block_n, block_k: the tiles (None: from the sizes; tests pick small ones).
    """
    num_rows, in_features = x.shape
    out_features = weight.shape[1]
    y = torch.empty(num_rows, out_features, dtype=x.dtype, device=x.device)
    if groups.num_tiles == 0:
        return y
    has_lora = lora_a is not None and groups.max_rank > 0
    widths = [b.shape[3] for b in lora_b] if has_lora else [out_features]
    block_n = block_n or min(MAX_BLOCK_N, max(16, triton.next_power_of_2(max(widths))))
    block_k = block_k or min(MAX_BLOCK_K, max(16, triton.next_power_of_2(in_features)))
    col_slices, col_starts = [], []
    for i, w in enumerate(widths):
        for start in range(0, w, block_n):  # column tiles never straddle two slices
            col_slices.append(i)
            col_starts.append(start)
    device = x.device
    tables = [
        device_table(tuple(v), torch.int32, device)
        for v in (col_slices, col_starts, widths, [sum(widths[:i]) for i in range(len(widths))])
    ]
    if has_lora:
        a_table = device_table(tuple(a.data_ptr() for a in lora_a), torch.int64, device)
        b_table = device_table(tuple(b.data_ptr() for b in lora_b), torch.int64, device)
        a0, b0 = lora_a[0], lora_b[0]
        # In rows: the slices share them (kernels/expert_linear.py: check_expert_linear).
        lora_strides = (a0.stride(0) // a0.stride(2), a0.stride(1) // a0.stride(2),
                        b0.stride(0) // b0.stride(2), b0.stride(1) // b0.stride(2))  # fmt: skip
        block_r = max(16, triton.next_power_of_2(a0.shape[2]))
        scales = scales.contiguous()  # indexed flat; no copy when it is
    else:  # never read
        a_table = b_table = scales = tables[0]
        lora_strides, block_r = (0, 0, 0, 0), 16
    is_fp8 = weight.dtype == FP8_DTYPE
    w_scale = w_scale if is_fp8 else tables[0]  # never read without FP8
    grid = (groups.num_tiles, len(col_slices))
    # Launch on x's GPU, whichever is current.
    with torch.cuda.device(device) if x.is_cuda else contextlib.nullcontext():
        _expert_linear_kernel[grid](
            x, weight, w_scale, y, a_table, b_table, scales, groups.tile_groups,
            groups.tile_rows, *tables, groups.experts, groups.slots, groups.starts,
            groups.lengths, groups.ranks, in_features, x.stride(0), x.stride(1),
            *weight.stride(), *(w_scale.stride() if is_fp8 else (0, 0)), y.stride(0),
            y.stride(1), *lora_strides, HAS_LORA=has_lora, IS_FP8=is_fp8,
            BLOCK_M=groups.block_m, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_R=block_r,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        )  # fmt: skip
    return y
