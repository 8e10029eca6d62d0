"""Triton FP8 x FP8 GEMM with the activations' per-token quantization fused in:
y = (x / sx[:, None] -> e4m3) @ w_q.T * sx[:, None] * scale[None, :] (+ bias).

sx[m] = amax(|x[m, :]|) / 448 (1 where the row is all zero), the same dynamic per-token scale
kernels/fp8.py's _scaled_mm_linear computes with separate torch ops before torch._scaled_mm.
Here no quantized copy of x is written: each program first reads its BLOCK_M rows of x over
all of K for their amax (x is small next to the weight at these sizes, and every n-block
program reads it again), then in the K loop quantizes each x tile in registers and feeds the
FP8 tile and the FP8 weight tile to tl.dot, accumulating in float32. sx[m] * scale[n] and the
bias are applied once per output, after the loop.

Under the Triton interpreter (no CUDA) tl.dot on FP8 operands is exact (it widens them, and
e4m3 values are exact in float16/float32), but the interpreter's float32 -> e4m3 cast is not
(Triton 3.9): it rounds ties away from zero, mis-rounds subnormals, and drops the carry when
rounding up crosses a power of two (7.93 becomes 4.0, not 8.0). So where ROUND_FIRST is set
(only off CUDA) each value is first rounded to the e4m3 grid in float32 arithmetic, to nearest
even as the hardware cast does; the cast then meets only representable values, which the
interpreter converts exactly. The FP8 tiles and the FP8 tl.dot are the same on both paths.

Grid: (n-blocks, m-blocks).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# Tiles for H100/H200, untimed (no GPU was at hand when they were written): each weight tile
# serves 64 rows. Shared memory per stage: 64x128 x elements (16 KiB at 16-bit x, 32 KiB at
# fp32) + 128x128 FP8 weight bytes (16 KiB); 3 stages at 16-bit x is 96 KiB, within Hopper's
# 227 KiB (and only just within sm_89's 99 KiB); fp32 x drops to 2 stages.
BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 64, 128, 128, 8, 3


@triton.jit
def _round_to_e4m3_grid(v):
    """v [BLOCK_M, BLOCK_K] float32, |v| <= 448, rounded to nearest (ties to even) e4m3 value."""
    # e4m3 keeps 3 mantissa bits: the step at |v| in [2^E, 2^(E+1)) is 2^(E-3), and below 2^-6
    # (subnormals) it is 2^-9. Adding then subtracting c = 1.5 * 2^(E-3+23) rounds v to a
    # multiple of that step by float32's own round-to-nearest-even: v + c lies in
    # [2^(E+20), 2^(E+21)), where float32's spacing is exactly the step.
    exponent = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased: E + 127
    exponent = tl.maximum(exponent, 127 - 6)
    c = (((exponent + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    return (v + c) - c


@triton.jit
def _fp8_rowwise_kernel(
    x_ptr,  # [M, K] float16 / bfloat16 / float32
    w_ptr,  # [N, K] float8_e4m3fn
    scale_ptr,  # [N] float32
    bias_ptr,  # [N] x's dtype (unused without HAS_BIAS)
    y_ptr,  # [M, N] x's dtype
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,
    HAS_BIAS: tl.constexpr,
    ROUND_FIRST: tl.constexpr,  # only off CUDA: see the module docstring
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm  # [BLOCK_M, 1]

    # Pass 1: each row's amax over all of K. Masked lanes read 0 (never the poisoned padding
    # of a strided x), so rows past M get amax 0 and scale 1.
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_rows + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & (offs_k < K)[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    sx = tl.where(amax > 0, amax / FP8_MAX, 1.0)  # [BLOCK_M] float32

    # Pass 2: x tiles quantized in registers, FP8 x FP8 products accumulated in float32.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_rows + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        v = tl.clamp(x.to(tl.float32) / sx[:, None], -FP8_MAX, FP8_MAX)
        if ROUND_FIRST:
            v = _round_to_e4m3_grid(v)
        x_q = v.to(tl.float8e4nv)  # [BLOCK_M, BLOCK_K] FP8
        # Loaded as stored, each output's inputs contiguous: wide loads of the FP8 bytes.
        w = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
            mask=mask_n[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_K] FP8
        # On sm_90 Triton would otherwise keep FP8 products in the tensor cores' narrower
        # accumulator over all of K: each tile's sum joins the float32 one instead.
        acc = tl.dot(x_q, tl.trans(w), acc, max_num_imprecise_acc=BLOCK_K)  # [BLOCK_M, BLOCK_N]

    scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)  # [BLOCK_N]
    acc = acc * sx[:, None] * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fp8_linear_rowwise(
    x2d: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y [M, N] = (x2d [M, K] per-token quantized to e4m3) @ w_q [N, K].T * sx * scale + bias,
    in x2d's dtype; arguments already checked by kernels.fp8 (bias, if given, in x2d's dtype)."""
    m, k = x2d.shape
    n = w_q.shape[0]
    # The kernel indexes scale and bias flat; x2d and w_q go by their strides.
    scale = scale.contiguous()
    bias = bias.contiguous() if bias is not None else None
    y = torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
    if m == 0 or n == 0:
        return y
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, BLOCK_M))
    with torch.cuda.device(x2d.device) if x2d.is_cuda else contextlib.nullcontext():
        _fp8_rowwise_kernel[grid](
            x2d, w_q, scale, bias if bias is not None else scale, y, m, n, k,
            x2d.stride(0), x2d.stride(1), w_q.stride(0), w_q.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, ROUND_FIRST=not x2d.is_cuda,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES if x2d.element_size() <= 2 else NUM_STAGES - 1,
        )  # fmt: skip
    return y
