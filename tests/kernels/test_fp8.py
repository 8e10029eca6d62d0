"""FP8 e4m3 per-output-channel quantization and the FP8 linear, against float64."""

import pytest
import torch

from kernels import fp8_linear, quantize_fp8
from kernels.fp8 import FP8_MAX, dequantize_fp8

# e4m3 keeps 3 mantissa bits: rounding to nearest is within 2^-4 of a normal value.
# Below 2^-6 (subnormals, in units of the row scale) the step is 2^-9, so half of it.
REL_BOUND = 2.0**-4
SUBNORMAL_ABS = 2.0**-10


def test_elementwise_error_is_within_e4m3_rounding():
    torch.manual_seed(0)
    w = (
        torch.randn(257, 129, dtype=torch.float64)
        * torch.logspace(-3, 2, 257, dtype=torch.float64)[:, None]
    )
    w_q, scale = quantize_fp8(w)
    assert (
        w_q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (257,)
    )
    err = (dequantize_fp8(w_q, scale, torch.float64) - w).abs()
    bound = torch.maximum(REL_BOUND * w.abs(), SUBNORMAL_ABS * scale.double()[:, None]) * (1 + 1e-6)
    assert (err <= bound).all()


def test_relative_error_of_gaussian_weights():
    """The measured error of a realistic weight: about 2-3% relative (Frobenius)."""
    torch.manual_seed(1)
    w = torch.randn(1024, 1024, dtype=torch.float64) * 0.02
    w_q, scale = quantize_fp8(w)
    rel = (dequantize_fp8(w_q, scale, torch.float64) - w).norm() / w.norm()
    assert 0.005 < rel < 0.035, rel  # a lower bound too: an exact copy is not FP8


def test_row_max_maps_to_fp8_max_and_saturates():
    w = torch.tensor([[1.0, -3.0, 0.5], [1e30, 2.0, -1e30], [0.0, 0.0, 0.0]])
    w_q, scale = quantize_fp8(w)
    q = w_q.float()
    assert torch.isfinite(q).all() and torch.isfinite(scale).all()
    assert q[0].abs().max() == FP8_MAX and q[1].abs().max() == FP8_MAX
    assert q[0, 1] == -FP8_MAX
    assert scale[2] == 1.0 and (q[2] == 0).all()  # all-zero row: no 0/0


def test_exactly_representable_values_round_trip():
    grid = torch.tensor([448.0, -448.0, 1.0, 0.5, -0.015625, 2.0**-9, 0.0, 96.0])
    w = grid[None, :] * torch.tensor([[1.0], [0.25], [3.0]])
    w_q, scale = quantize_fp8(w)
    assert torch.equal(dequantize_fp8(w_q, scale, torch.float32), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_matches_float64(dtype):
    torch.manual_seed(2)
    x = torch.randn(3, 5, 96)
    w = torch.randn(80, 96) / 10
    bias = torch.randn(80)
    w_q, scale = quantize_fp8(w)
    y = fp8_linear(x.to(dtype), w_q, scale, bias.to(dtype))
    assert y.shape == (3, 5, 80) and y.dtype == dtype
    exact = x.double() @ dequantize_fp8(w_q, scale, torch.float64).T + bias.double()
    tol = {torch.float32: 1e-4, torch.bfloat16: 6e-2, torch.float16: 1e-2}[dtype]
    torch.testing.assert_close(y.double(), exact, atol=tol, rtol=tol)
    original = x.double() @ w.double().T + bias.double()
    rel = (y.double() - original).norm() / original.norm()
    assert rel < 0.05


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: quantize_fp8(torch.ones(4)), r"weight: expected shape \[out, in\]"),
        (lambda: quantize_fp8(torch.ones(2, 2, dtype=torch.int32)), r"weight: expected a float16"),
        (lambda: quantize_fp8(torch.tensor([[1.0, float("nan")]])), r"weight: contains NaN or Inf"),
        (lambda: quantize_fp8("w"), r"weight: expected a torch.Tensor"),
        (
            lambda: fp8_linear(torch.ones(2, 3), *quantize_fp8(torch.ones(4, 5))),
            r"x: expected last dimension 5",
        ),
        (
            lambda: fp8_linear(torch.ones(2, 5), torch.ones(4, 5), torch.ones(4)),
            r"w_q: expected a float8_e4m3fn",
        ),
        (
            lambda: fp8_linear(torch.ones(2, 5), quantize_fp8(torch.ones(4, 5))[0], torch.ones(3)),
            r"scale: expected a tensor of shape \(4,\)",
        ),
        (
            lambda: fp8_linear(torch.ones(2, 5), *quantize_fp8(torch.ones(4, 5)), torch.ones(5)),
            r"bias: expected a tensor of shape \(4,\)",
        ),
        (
            lambda: fp8_linear(
                torch.ones(2, 5, dtype=torch.int64), *quantize_fp8(torch.ones(4, 5))
            ),
            r"x: expected a float16/bfloat16/float32",
        ),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.gpu
def test_scaled_mm_path_on_cuda():
    """On sm_89+ the FP8 GEMM path agrees with the dequantized path within activation rounding."""
    torch.manual_seed(3)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    w_q, scale = quantize_fp8(torch.randn(256, 512, device="cuda") / 20)
    y = fp8_linear(x, w_q, scale)
    ref = x.double() @ dequantize_fp8(w_q, scale, torch.float64).T
    rel = (y.double() - ref).norm() / ref.norm()
    assert rel < 0.05
