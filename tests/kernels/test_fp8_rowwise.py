"""The FP8 GEMM with per-token activation quantization fused in, against float64.

Without a GPU it runs in the Triton interpreter. There the FP8 x FP8 tl.dot itself runs
(exactly: the interpreter widens both operands), so bf16 x works too (the interpreter's bf16
tl.dot is wrong, but this kernel never has one). The kernel rounds x to the e4m3 grid in float32
before its cast to FP8 there, since the interpreter's cast rounds wrongly;
test_quantizes_each_value_as_torchs_cast checks that rounding value for value. On a GPU the
gpu-marked tests run the hardware cast and FP8 dot, NaN-poisoned padding, and fp8_linear's
dispatch.
"""

import pytest
import torch

import kernels.fp8 as fp8
from kernels import fp8_linear, quantize_fp8
from kernels.fp8_rowwise_triton import BLOCK_K, BLOCK_M, BLOCK_N, fp8_linear_rowwise

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
E4M3 = torch.float8_e4m3fn
# Largest relative (Frobenius) error of any row against the oracle: both quantize x the same
# way, so what is left is float32 accumulation and the output's rounding.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def oracle(x, w_q, scale, b):
    """y in float64 from x quantized per token, written apart from the kernel: sx = amax/448 (1
    for a zero row) and x / sx in float32, as the contract states, rounded by torch's cast."""
    xf = x.cpu().float()
    amax = xf.abs().amax(dim=1, keepdim=True)  # [M, 1]
    sx = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    x_q = (xf / sx).clamp(-448, 448).to(E4M3)
    y = (x_q.double() * sx.double()) @ (w_q.cpu().double() * scale.cpu().double()[:, None]).T
    return y + b.cpu().double() if b is not None else y


def inputs(m, k, n, dtype, seed, bias):
    gen = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: each token's own scale must be applied; and a zero row.
    x = torch.randn(m, k, generator=gen) * torch.logspace(2, -3, m)[:, None]
    if m > 1:
        x[m // 2] = 0
    # Outputs of very different magnitudes: each channel's own scale must be applied.
    w_q, scale = quantize_fp8(torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, n)[:, None])
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x.to(dtype), w_q, scale, b


def worst_row_error(y, want):
    """max over rows of |y_r - want_r| / |want_r| (a zero row must come out exactly zero)."""
    diff = (y.cpu().double() - want).norm(dim=1)
    return (diff / want.norm(dim=1).clamp(min=1e-300)).max().item()


def on(*tensors):
    return [t.to(DEVICE) if t is not None else None for t in tensors]


# N and K are not multiples of the tiles, and 70 rows span two m-blocks.
@pytest.mark.parametrize(
    "m, k, n, dtype, bias",
    [
        (1, 300, 200, torch.float32, True),
        (17, 130, 33, torch.float16, False),
        (17, 300, 200, torch.float32, False),
        (70, 300, 200, torch.float32, True),
        (70, 130, 200, torch.float16, True),
        (17, 130, 200, torch.bfloat16, True),  # the dot is FP8 x FP8 whatever x's dtype
    ],
)
def test_matches_the_per_token_quantized_product(m, k, n, dtype, bias):
    assert k % BLOCK_K and n % BLOCK_N
    x, w_q, scale, b = inputs(m, k, n, dtype, seed=m + k + n, bias=bias)
    y = fp8_linear_rowwise(*on(x, w_q, scale, b))
    assert y.dtype == dtype and y.shape == (m, n)
    assert worst_row_error(y, oracle(x, w_q, scale, b)) < TOLERANCE[dtype]


def test_quantizes_each_value_as_torchs_cast():
    """With an identity weight y = e4m3(x / sx) * sx exactly: the kernel's rounding (the
    interpreter's float32 emulation, or the GPU's cast) against torch's, value for value."""
    k = BLOCK_K + 33
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(BLOCK_M + 3, k, generator=gen) * torch.logspace(-4, 3, BLOCK_M + 3)[:, None]
    # Row 0 has amax 448 (sx = 1): midpoints between e4m3 values (ties go to even), values that
    # round up across a power of two, subnormals (step 2^-9) and their midpoints.
    special = [448.0, 1.0625, 1.1875, -1.0625, 7.9, 7.99, 15.5, 0.49, 3 * 2.0**-10, 2.0**-10,
               5 * 2.0**-10, -3 * 2.0**-10, 2.0**-7 + 2.0**-11, 0.0, 440.0, -447.0]  # fmt: skip
    x[0, : len(special)] = torch.tensor(special)
    eye = torch.eye(k).to(E4M3)
    y = fp8_linear_rowwise(*on(x, eye, torch.ones(k)))
    amax = x.abs().amax(dim=1, keepdim=True)
    sx = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    want = (x / sx).clamp(-448, 448).to(E4M3).float() * sx
    if ON_GPU:
        # Triton's float32 division on CUDA is within 2 ulp, not rounded to nearest: a value
        # next to a midpoint may go the other way.
        assert (y.cpu() != want).float().mean() < 1e-3
    else:
        assert torch.equal(y, want)


def test_zero_row_and_poisoned_padding():
    """x a strided view into NaN-filled storage (row stride past K) with an all-zero row: the
    amax reads only x's own elements, and the zero row gives exactly the bias."""
    m, k, n = 70, 300, 200
    x, w_q, scale, b = inputs(m, k, n, torch.float32, seed=11, bias=True)
    wide = torch.full((m + 1, k + 40), float("nan"))
    view = wide[:m, 8 : 8 + k]
    view.copy_(x)
    assert view.stride(0) == k + 40
    y = fp8_linear_rowwise(*on(view, w_q, scale, b))
    assert not y.isnan().any()
    assert torch.equal(y[m // 2].cpu(), b)
    assert worst_row_error(y, oracle(x, w_q, scale, b)) < TOLERANCE[torch.float32]


def test_no_rows():
    _, w_q, scale, _ = inputs(1, 48, 20, torch.float32, seed=1, bias=False)
    y = fp8_linear_rowwise(*on(torch.empty(0, 48), w_q, scale))
    assert y.shape == (0, 20)


def _needs_fp8_tensor_cores():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tl.dot needs sm_89+")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [32, 100])
def test_bf16_on_cuda(m):
    """The hardware cast and FP8 tl.dot, in bf16, tails in every dimension, a zero row, and x
    and w_q as views into NaN-filled storage. Only here does the weight's K mask show (a NaN
    weight byte times x's masked zero): the interpreter widens an FP8 NaN to a finite value."""
    _needs_fp8_tensor_cores()
    k, n = 4096 + 40, 1000
    x, w_q, scale, b = inputs(m, k, n, torch.bfloat16, seed=m, bias=True)
    x_view = torch.full((m, k + 24), float("nan"), dtype=torch.bfloat16, device=DEVICE)[:, 8:-16]
    w_view = torch.full((n, k + 32), float("nan"), device=DEVICE).to(E4M3)[:, 16:-16]
    x_view.copy_(x)
    w_view.view(torch.uint8).copy_(w_q.view(torch.uint8))
    y = fp8_linear_rowwise(x_view, w_view, *on(scale, b))
    assert y.dtype == torch.bfloat16 and not y.isnan().any()
    assert worst_row_error(y, oracle(x, w_q, scale, b)) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_fp8_linear_runs_it_past_small_m(monkeypatch):
    """With LARGE_M_PATH "triton", fp8_linear sends a batch past SMALL_M (with a batch
    dimension) to this kernel."""
    _needs_fp8_tensor_cores()
    import kernels.fp8_rowwise_triton as rowwise

    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return fp8_linear_rowwise(*args)

    monkeypatch.setattr(fp8, "LARGE_M_PATH", "triton")
    monkeypatch.setattr(rowwise, "fp8_linear_rowwise", counted)
    x, w_q, scale, b = inputs(48, 512, 256, torch.bfloat16, seed=2, bias=True)
    y = fp8_linear(*on(x.reshape(2, 24, 512), w_q, scale, b))
    assert calls == [(48, 512)] and y.shape == (2, 24, 256)
    assert worst_row_error(y.reshape(48, 256), oracle(x, w_q, scale, b)) < 1e-2
