"""Triton kernel for fp8_linear at decode sizes: y = x @ (w_q * scale[:, None]).T (+ bias).

A decode or verify step multiplies a few rows by every weight: the time is reading the
weights. This kernel streams them once as FP8 (half bf16's bytes), widens each tile to x's
dtype in registers (e4m3 values are exact in bf16/fp16/fp32) and multiplies in x's dtype
with a float32 accumulator; the per-channel scale and bias are applied once per output.
x is not quantized, so it is closer to the dequantized reference than the FP8 x FP8 GEMM
that serves larger batches.

Grid: (n-blocks, m-blocks). BLOCK_N halves where the n-blocks alone would not cover the
GPU's multiprocessors, since a handful of rows give no other parallelism.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kernels.device_info import multiprocessors

# Rows up to which the weight-streaming kernel wins: one 16-row tile costs the same for 1 to
# 16 rows (on an H200: 0.67x a bf16 matmul's time at 4096 -> 12288), and at 32 rows it
# was already slower than bf16.
SMALL_M = 16
# On an H200 (4096 -> 12288, 4 rows): [32 outputs x 256 inputs] tiles, 4 warps and 5
# stages in flight were the fastest of 36 shapes tried, 15% ahead of 128-wide K tiles.
BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 32, 256, 4, 5


@triton.jit
def _fp8_small_m_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        # Loaded as stored, each output's inputs contiguous: wide loads of the FP8 bytes.
        w = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
            mask=mask_n[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_K] FP8
        acc += tl.dot(x, tl.trans(w.to(x_ptr.dtype.element_ty)), input_precision=DOT_PRECISION)
    acc *= tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fp8_linear_small_m(
    x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ (w_q [N, K] * scale[:, None]).T + bias, M small; arguments
    already checked by kernels.fp8."""
    m, k = x.shape
    n = w_q.shape[0]
    # The kernel indexes them flat (views are accepted by the checks); no copy when they are.
    scale = scale.contiguous()
    bias = bias.contiguous() if bias is not None else None
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_m = max(16, triton.next_power_of_2(m))
    # Narrower tiles where the outputs alone would leave multiprocessors idle.
    block_n = BLOCK_N if triton.cdiv(n, BLOCK_N) >= multiprocessors(x.device) else 16
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _fp8_small_m_kernel[grid](
            x, w_q, scale, bias if bias is not None else scale, y, m, n, k,
            x.stride(0), x.stride(1), w_q.stride(0), w_q.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )  # fmt: skip
    return y
