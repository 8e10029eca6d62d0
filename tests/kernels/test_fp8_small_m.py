"""The decode-size FP8 linear (weights widened in registers) against float64.

Without a GPU it runs in the Triton interpreter, in fp32 and fp16 (the interpreter's tl.dot
is wrong for bf16); on a GPU fp8_linear routes batches of up to SMALL_M rows to it.
"""

import pytest
import torch

from kernels import fp8_linear, quantize_fp8
from kernels.fp8 import dequantize_fp8
from kernels.fp8_small_m_triton import SMALL_M, fp8_linear_small_m

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def inputs(m, k, n, dtype, seed, bias):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    # Rows of very different magnitudes: each output channel's own scale must be applied.
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, n)[:, None]
    w_q, scale = quantize_fp8(w)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, w_q, scale, b


def reference(x, w_q, scale, b):
    """x @ (w_q * scale).T + b in float64: the dequantized weight, exactly."""
    y = x.double() @ dequantize_fp8(w_q, scale, torch.float64).T
    return y + b.double() if b is not None else y


@pytest.mark.parametrize(
    "m, k, n, dtype, bias",
    [
        (1, 40, 24, torch.float32, False),
        (5, 130, 70, torch.float32, True),
        (17, 257, 33, torch.float16, True),
        (32, 64, 16, torch.float16, False),
    ],
)
def test_matches_the_dequantized_product(m, k, n, dtype, bias):
    x, w_q, scale, b = inputs(m, k, n, dtype, seed=m + k, bias=bias)
    on = [t.to(DEVICE) if t is not None else None for t in (x, w_q, scale, b)]
    y = fp8_linear_small_m(*on).cpu()
    assert y.dtype == dtype and y.shape == (m, n)
    want = reference(x, w_q, scale, b)
    rel = (y.double() - want).norm() / want.norm()
    assert rel < TOLERANCE[dtype]


def test_strided_scale_and_bias():
    """scale and bias as views with a stride: the kernel reads them flat after all."""
    x, w_q, scale, b = inputs(3, 48, 20, torch.float32, seed=5, bias=True)
    strided_scale = torch.stack([scale, scale * 9], dim=1)[:, 0]  # stride 2
    strided_bias = torch.stack([b, b - 5], dim=1)[:, 0]
    assert strided_scale.stride() == (2,) and strided_bias.stride() == (2,)
    on = [t.to(DEVICE) for t in (x, w_q)]
    y = fp8_linear_small_m(*on, strided_scale.to(DEVICE), strided_bias.to(DEVICE)).cpu()
    torch.testing.assert_close(y.double(), reference(x, w_q, scale, b), rtol=1e-5, atol=1e-5)


def test_strided_rows_and_no_rows():
    """x as a view with a row stride past its width; zero rows give an empty output."""
    x, w_q, scale, _ = inputs(6, 48, 20, torch.float32, seed=4, bias=False)
    wide = torch.zeros(6, 80)
    wide[:, 8:56] = x
    view = wide[:, 8:56]
    y = fp8_linear_small_m(view.to(DEVICE), w_q.to(DEVICE), scale.to(DEVICE)).cpu()
    torch.testing.assert_close(y.double(), reference(x, w_q, scale, None), rtol=1e-5, atol=1e-5)
    empty = fp8_linear_small_m(torch.empty(0, 48, device=DEVICE), w_q.to(DEVICE), scale.to(DEVICE))
    assert empty.shape == (0, 20)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, SMALL_M, SMALL_M + 1])
def test_fp8_linear_on_cuda_either_side_of_small_m(m):
    """fp8_linear in bf16 on both sides of SMALL_M (this kernel, then the FP8 GEMM), with a
    batch dimension, against the float64 dequantized product."""
    x, w_q, scale, b = inputs(m, 512, 256, torch.bfloat16, seed=m, bias=True)
    y = fp8_linear(x.cuda()[None], w_q.cuda(), scale.cuda(), b.cuda())[0].cpu()
    want = reference(x, w_q, scale, b)
    rel = (y.double() - want).norm() / want.norm()
    assert rel < (1e-2 if m <= SMALL_M else 5e-2)  # the GEMM also rounds x to FP8


@pytest.mark.gpu
def test_the_output_dtype_does_not_depend_on_the_row_count():
    """A bias of another dtype than x's promotes the output the same way on both paths."""
    x, w_q, scale, b = inputs(SMALL_M + 1, 64, 32, torch.bfloat16, seed=9, bias=True)
    args = (w_q.cuda(), scale.cuda(), b.float().cuda())
    few, many = (fp8_linear(x[:n].cuda(), *args) for n in (4, SMALL_M + 1))
    assert few.dtype == many.dtype == torch.float32
