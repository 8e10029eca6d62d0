"""FP8 e4m3 weights with block-wise scales (transformers' fine-grained "fp8"), against float64.

The Triton kernel runs in the interpreter without a GPU (set in conftest), in fp32 and fp16
only: the interpreter's tl.dot is wrong for bf16. Sizes stay small because every program
instance runs in Python there. Operands sit in NaN-filled storage wherever the kernel must
not read.
"""

import pytest
import torch

from kernels import dequantize_fp8_blocks, fp8_block_linear, quantize_fp8_blocks
from kernels.fp8 import FP8_MAX
from kernels.fp8_block_triton import DECODE_ROWS, fp8_block_linear_triton

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# Relative (Frobenius) error against the float64 product of the stored weight.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# e4m3 keeps 3 mantissa bits: rounding to nearest is within 2^-4 of a normal value.
# Below 2^-6 (subnormals, in units of the block scale) the step is 2^-9, so half of it.
REL_BOUND = 2.0**-4
SUBNORMAL_ABS = 2.0**-10


def oracle_weight(w_q, scale, block):
    """W[i, j] = w_q[i, j] * scale[i // bo, j // bi] in float64, written apart from the code."""
    rows = torch.arange(w_q.shape[0]) // block[0]
    cols = torch.arange(w_q.shape[1]) // block[1]
    return w_q.cpu().double() * scale.cpu().double()[rows[:, None], cols[None, :]]


def oracle(x, w_q, scale, block, b):
    y = x.cpu().double() @ oracle_weight(w_q, scale, block).T
    return y + b.cpu().double() if b is not None else y


def weights(n, k, seed):
    """Magnitudes that change along both dimensions: each block's own scale must be used."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64)
    return (
        w
        * torch.logspace(-2, 1, n, dtype=torch.float64)[:, None]
        * torch.logspace(1, -1, k, dtype=torch.float64)
    )


def rel_error(y, want):
    return ((y.cpu().double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize(
    "n, k, block", [(257, 130, (64, 48)), (200, 72, (64, 32)), (128, 256, (128, 128))]
)
def test_quantize_round_trip_is_within_e4m3_rounding(n, k, block):
    w = weights(n, k, seed=n + k)
    w_q, scale = quantize_fp8_blocks(w, block)
    rows, cols = -(-n // block[0]), -(-k // block[1])
    assert w_q.dtype == torch.float8_e4m3fn and w_q.shape == (n, k)
    assert scale.dtype == torch.float32 and scale.shape == (rows, cols)
    exact = oracle_weight(w_q, scale, block)
    assert torch.equal(dequantize_fp8_blocks(w_q, scale, block, torch.float64), exact)
    per_element_scale = oracle_weight(torch.ones(n, k), scale, block)
    bound = torch.maximum(REL_BOUND * w.abs(), SUBNORMAL_ABS * per_element_scale) * (1 + 1e-6)
    assert ((exact - w).abs() <= bound).all()
    # Every block's largest magnitude maps to the FP8 max, short edge blocks included.
    q = w_q.float().abs()
    for r in range(rows):
        for c in range(cols):
            tile = q[r * block[0] : (r + 1) * block[0], c * block[1] : (c + 1) * block[1]]
            assert tile.max() == FP8_MAX


def test_zero_block_gets_scale_one_and_huge_blocks_stay_finite():
    w = torch.zeros(6, 5)
    w[:3, :2] = torch.tensor([[1.0, -3.0], [0.5, 2.0], [0.0, 1.0]])
    w[3:, 2:] = torch.tensor([[1e30, 1.0, 0.0], [2.0, -1e30, 0.0], [0.0, 0.0, 5.0]])
    w_q, scale = quantize_fp8_blocks(w, (3, 2))  # scale [2, 3]; blocks (0, 1), (0, 2), (1, 0)
    assert torch.isfinite(w_q.float()).all() and torch.isfinite(scale).all()
    assert scale[0, 1] == scale[0, 2] == scale[1, 0] == 1.0
    assert (w_q.float()[:3, 2:] == 0).all() and (w_q.float()[3:, :2] == 0).all()
    assert w_q.float()[0, 1] == -FP8_MAX and w_q.float()[4, 3] == -FP8_MAX


def test_exactly_representable_values_round_trip():
    grid = torch.tensor([448.0, -448.0, 1.0, 0.5, -0.015625, 2.0**-9, 0.0, 96.0])
    w = torch.cat([grid * 0.25, grid * 3.0])[None, :].repeat(4, 1)  # two blocks of 8 columns
    w_q, scale = quantize_fp8_blocks(w, (4, 8))
    assert scale.tolist() == [[0.25, 3.0]]
    assert torch.equal(dequantize_fp8_blocks(w_q, scale, (4, 8), torch.float32), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_linear_is_the_dequantized_product(dtype):
    block = (64, 32)
    x = torch.randn(2, 3, 72, generator=torch.Generator().manual_seed(1)).to(dtype)
    w_q, scale = quantize_fp8_blocks(weights(200, 72, seed=2) / 10, block)
    b = torch.randn(200).to(dtype)
    y = fp8_block_linear(x, w_q, scale, block, b)
    assert y.shape == (2, 3, 200) and y.dtype == dtype
    assert torch.equal(y, x @ dequantize_fp8_blocks(w_q, scale, block, dtype).T + b)
    assert rel_error(y, oracle(x, w_q, scale, block, b)) < TOLERANCE[dtype]


def poisoned(t, pad=(2, 3), column_major=False):
    """t on DEVICE as a strided view into a copy surrounded by NaN (pad rows and columns on
    each side). The interpreter reads e4m3's NaN as 480, so w_q's poison bites on a GPU only."""
    if column_major:
        return poisoned(t.T, pad[::-1]).T
    fill = torch.full(
        (t.shape[0] + 2 * pad[0], t.shape[1] + 2 * pad[1]), float("nan"), dtype=torch.float32
    ).to(t.dtype)
    fill[pad[0] : pad[0] + t.shape[0], pad[1] : pad[1] + t.shape[1]] = t
    view = fill.to(DEVICE)[pad[0] : pad[0] + t.shape[0], pad[1] : pad[1] + t.shape[1]]
    assert view.stride(0) != t.shape[1]
    return view


def poisoned_bias(b):
    """b [n] as a view with stride 2, NaN between its elements."""
    return torch.stack([b, torch.full_like(b, float("nan"))], dim=1).to(DEVICE)[:, 0]


@pytest.mark.parametrize(
    "m, n, k, block, dtype, bias, scale_by_columns",
    [
        (1, 200, 72, (64, 32), torch.float32, True, False),  # short last blocks, both ways
        (5, 200, 72, (64, 48), torch.float16, True, True),  # bi not a power of two, nor dividing
        (DECODE_ROWS + 17, 40, 130, (16, 128), torch.float32, False, True),  # the batch tiles
        (5, 24, 40, (7, 5), torch.float16, False, False),  # blocks narrower than a dot tile
        (3, 48, 256, (48, 128), torch.float32, True, False),  # checkpoint-like bi = 128
    ],
)
def test_triton_kernel_matches_the_oracle(m, n, k, block, dtype, bias, scale_by_columns):
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w_q, scale = quantize_fp8_blocks(weights(n, k, seed=m), block)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    y = fp8_block_linear_triton(
        poisoned(x), poisoned(w_q), poisoned(scale, (1, 2), scale_by_columns), block,
        poisoned_bias(b) if bias else None,
    )  # fmt: skip
    assert y.shape == (m, n) and y.dtype == dtype
    assert not y.isnan().any()
    assert rel_error(y, oracle(x, w_q, scale, block, b)) < TOLERANCE[dtype]


def test_triton_kernel_with_no_rows():
    w_q, scale = quantize_fp8_blocks(torch.ones(20, 48), (16, 16))
    on = [t.to(DEVICE) for t in (torch.empty(0, 48), w_q, scale)]
    assert fp8_block_linear_triton(*on, (16, 16)).shape == (0, 20)


W_Q, SCALE = quantize_fp8_blocks(torch.ones(4, 5), (2, 2))  # scale [2, 3]
X = torch.ones(2, 5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: quantize_fp8_blocks(torch.ones(4), (2, 2)), r"weight: expected shape \[out, in\]"),
        (
            lambda: quantize_fp8_blocks(torch.ones(2, 2, dtype=torch.int32), (2, 2)),
            r"weight: expected a float16",
        ),
        (
            lambda: quantize_fp8_blocks(torch.tensor([[1.0, float("inf")]]), (2, 2)),
            r"weight: contains NaN or Inf",
        ),
        (lambda: quantize_fp8_blocks("w", (2, 2)), r"weight: expected a torch.Tensor"),
        (lambda: quantize_fp8_blocks(torch.ones(2, 2), (0, 2)), r"block: expected two positive"),
        (lambda: quantize_fp8_blocks(torch.ones(2, 2), (2,)), r"block: expected two positive"),
        (lambda: quantize_fp8_blocks(torch.ones(2, 2), (2.0, 2)), r"block: expected two positive"),
        (lambda: fp8_block_linear(X, W_Q, SCALE, (2, True)), r"block: expected two positive"),
        (
            lambda: fp8_block_linear(X.to(torch.int64), W_Q, SCALE, (2, 2)),
            r"x: expected a float16/bfloat16/float32",
        ),
        (lambda: fp8_block_linear(X.double(), W_Q, SCALE, (2, 2)), r"x: expected a float16"),
        (lambda: fp8_block_linear(torch.ones(2, 4), W_Q, SCALE, (2, 2)), r"x: expected last dim"),
        (lambda: fp8_block_linear(X, torch.ones(4, 5), SCALE, (2, 2)), r"w_q: expected a float8"),
        (lambda: fp8_block_linear(X, W_Q[0], SCALE, (2, 2)), r"w_q: expected a float8"),
        (
            lambda: fp8_block_linear(X, W_Q, SCALE[:, :2], (2, 2)),
            r"scale: expected a float32 tensor of shape \(2, 3\)",
        ),
        (lambda: fp8_block_linear(X, W_Q, SCALE, (2, 3)), r"scale: .* shape \(2, 2\)"),
        (lambda: fp8_block_linear(X, W_Q, SCALE.half(), (2, 2)), r"scale: expected a float32"),
        (
            lambda: fp8_block_linear(X, W_Q, SCALE, (2, 2), torch.ones(5)),
            r"bias: expected a float tensor of shape \(4,\)",
        ),
        (
            lambda: fp8_block_linear(X, W_Q, SCALE, (2, 2), torch.ones(4, dtype=torch.int64)),
            r"bias: expected a float tensor",
        ),
        (
            lambda: fp8_block_linear(X.to("meta"), W_Q, SCALE, (2, 2)),
            r"w_q: expected a tensor on meta",
        ),
        (
            lambda: fp8_block_linear(X, W_Q, SCALE.to("meta"), (2, 2)),
            r"scale: expected a tensor on cpu",
        ),
        (
            lambda: fp8_block_linear(X, W_Q, SCALE, (2, 2), torch.ones(4, device="meta")),
            r"bias: expected a tensor on cpu",
        ),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, DECODE_ROWS, DECODE_ROWS + 1, 300])
@pytest.mark.parametrize(
    "n, k, block", [(512, 384, (128, 128)), (200, 72, (64, 32)), (384, 200, (128, 48))]
)
def test_cuda_path_in_bf16(m, n, k, block):
    """fp8_block_linear on sm_89+ (the Triton kernel), with a batch dimension and a bias."""
    gen = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w_q, scale = quantize_fp8_blocks(weights(n, k, seed=m) / 10, block)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    # Poisoned operands: on a GPU a read of w_q's padding (e4m3 NaN) shows in y.
    y = fp8_block_linear(poisoned(x)[None], poisoned(w_q), poisoned(scale), block, b.cuda())
    assert y.shape == (1, m, n) and y.dtype == torch.bfloat16
    assert not y.isnan().any()
    assert rel_error(y[0], oracle(x, w_q, scale, block, b)) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_cuda_bias_of_another_dtype_promotes_as_on_the_cpu():
    w_q, scale = quantize_fp8_blocks(weights(64, 64, seed=3), (32, 32))
    x, b = torch.randn(4, 64).to(torch.bfloat16), torch.randn(64)
    y = fp8_block_linear(x.cuda(), w_q.cuda(), scale.cuda(), (32, 32), b.cuda())
    assert y.dtype == fp8_block_linear(x, w_q, scale, (32, 32), b).dtype == torch.float32
    assert rel_error(y, oracle(x, w_q, scale, (32, 32), b)) < TOLERANCE[torch.bfloat16]
