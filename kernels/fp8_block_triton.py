"""Triton kernel for fp8_block_linear: y = x @ (w_q * block scales).T (+ bias), any row count.

The FP8 weight streams in [BLOCK_N, BLOCK_K] tiles and is widened in registers to x's dtype
(e4m3 values are exact in bf16/fp16/fp32); x is not quantized. Each tile's product goes to a
float32 partial that is multiplied by its block's scale before joining the accumulator, as
block-scaled GEMMs do (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.3): the
weight itself is never rounded after scaling.

A tile never spans two scale columns: BLOCK_K is at most bi, and the K loop walks scale block
by scale block, each in ceil(bi / BLOCK_K) tiles masked at the block's end. Along N the scale
is gathered per output (row n reads scale[n // bo, kb]), so BLOCK_N need not divide bo. Any
(bo, bi) works, including ones that leave a short last block in either dimension:

    in = 72, bi = 32, BLOCK_K = 32:  tiles [0, 32) [32, 64) [64, 72)  ->  scale columns 0 1 2
    in = 72, bi = 48, BLOCK_K = 32:  tiles [0, 32) [32, 48) [48, 72) [80, 96)  ->  columns 0 0 1 1
                                     (the last tile lies past in: masked whole, it adds 0)

Grid: (n-blocks, m-blocks).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kernels.device_info import multiprocessors

# Launch shapes, by row count: (BLOCK_M, BLOCK_N, largest BLOCK_K, num_warps, num_stages).
# Up to DECODE_ROWS rows the time is reading the weight, so one 16-row tile with narrow N
# tiles, the shape kernels/fp8_small_m_triton.py measured best; BLOCK_K stops at 128 because
# checkpoints use bi = 128. Larger batches reuse each weight tile over 64 rows. These were not
# timed for block scales: no GPU was at hand when they were written.
DECODE_ROWS = 16
DECODE_TILES = (16, 32, 128, 4, 4)
# Shared memory at fp32 x: 3 stages x (64x64x4 + 128x64 bytes) = 72 KiB, within sm_89's 99 KiB.
BATCH_TILES = (64, 128, 64, 4, 3)
MIN_DOT = 16  # tl.dot's smallest tile side


@triton.jit
def _fp8_block_kernel(
    x_ptr,  # [M, K] float16 / bfloat16 / float32
    w_ptr,  # [N, K] float8_e4m3fn
    scale_ptr,  # [ceil(N / BO), ceil(K / BI)] float32
    bias_ptr,  # [N] x's dtype (unused without HAS_BIAS)
    y_ptr,  # [M, N] x's dtype
    M,
    N,
    K,
    BO,
    BI,
    num_tiles,  # ceil(K / BI) * K_TILES
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    stride_ym,
    stride_yn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_TILES: tl.constexpr,  # tiles per scale block: ceil(BI / BLOCK_K)
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # Each output's row of scales, [BLOCK_N] pointers: outputs of one tile may sit in
    # different scale rows when BLOCK_N does not divide BO.
    scale_rows = scale_ptr + (offs_n // BO) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(0, num_tiles):
        kb = t // K_TILES  # the scale column of this tile
        k_end = kb * BI + BI
        offs_k = kb * BI + (t % K_TILES) * BLOCK_K + tl.arange(0, BLOCK_K)
        # Cut at the scale block's end (the tile must not reach the next scale) and at K.
        mask_k = (offs_k < k_end) & (offs_k < K)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        w = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
            mask=mask_n[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_K] FP8
        part = tl.dot(x, tl.trans(w.to(x_ptr.dtype.element_ty)), input_precision=DOT_PRECISION)
        s = tl.load(scale_rows + kb * stride_sk, mask=mask_n, other=0.0)  # [BLOCK_N]
        acc += part * s[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fp8_block_linear_triton(
    x: torch.Tensor,
    w_q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ (w_q [N, K] * block scales).T + bias; arguments already checked
    by kernels.fp8_block (bias, if given, in x's dtype)."""
    m, k = x.shape
    n = w_q.shape[0]
    bo, bi = block
    # The kernel indexes bias flat; x, w_q and scale go by their strides.
    bias = bias.contiguous() if bias is not None else None
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    block_m, block_n, max_block_k, num_warps, num_stages = (
        DECODE_TILES if m <= DECODE_ROWS else BATCH_TILES
    )
    # Narrower tiles where a few rows' outputs alone would leave multiprocessors idle.
    if m <= DECODE_ROWS and triton.cdiv(n, block_n) < multiprocessors(x.device):
        block_n = MIN_DOT
    # The largest power of two within bi (a short tail tile covers the rest of each block).
    block_k = min(max_block_k, max(MIN_DOT, 1 << (bi.bit_length() - 1)))
    k_tiles = triton.cdiv(bi, block_k)
    num_tiles = triton.cdiv(k, bi) * k_tiles
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _fp8_block_kernel[grid](
            x, w_q, scale, bias if bias is not None else scale, y, m, n, k, bo, bi, num_tiles,
            x.stride(0), x.stride(1), w_q.stride(0), w_q.stride(1),
            scale.stride(0), scale.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            K_TILES=k_tiles, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
    return y
