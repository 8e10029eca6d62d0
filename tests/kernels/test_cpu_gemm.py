"""The prepacked CPU linear against a float64 oracle, on both sides of its size cut-over."""

import dataclasses

import pytest
import torch

from kernels import pack_weight, packed_linear
from kernels.cpu_gemm import MIN_PACKED_MACS, ROW_BUCKETS, packed_shapes, row_pieces
from serving.model.linear import Linear

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def _close_to_oracle(y, x, w, b):
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    # float32 accumulation over `in` terms of unit-variance products
    assert y.dtype == torch.float32 and y.shape == ref.shape
    if ref.numel():
        tol = 1e-5 * x.shape[-1] ** 0.5 * (1 + ref.abs().max().item())
        assert (y.double() - ref).abs().max().item() < tol


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 32, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_above_and_below_the_cut_over(rows, with_bias):
    torch.manual_seed(rows)
    w = torch.randn(384, 320)
    b = torch.randn(384) if with_bias else None
    x = torch.randn(rows, 320)
    packed = pack_weight(w)
    assert packed is not None
    # 32 and 200 rows cross MIN_PACKED_MACS, so both branches are checked
    assert (rows * 384 * 320 >= MIN_PACKED_MACS) == (rows >= 32)
    _close_to_oracle(packed_linear(x, w, packed, b), x, w, b)


@needs_onednn
def test_leading_dims_and_strided_input():
    torch.manual_seed(1)
    w = torch.randn(256, 512)
    wide = torch.randn(4, 40, 600)
    x = wide[..., 50:562]  # [4, 40, 512], not contiguous
    y = packed_linear(x, w, pack_weight(w), None)
    assert y.shape == (4, 40, 256)
    _close_to_oracle(y, x, w, None)


def test_only_float32_cpu_matrices_are_packed():
    assert pack_weight(torch.randn(8, 8, dtype=torch.bfloat16)) is None
    assert pack_weight(torch.randn(8, 8, dtype=torch.float64)) is None
    assert pack_weight(torch.randn(2, 8, 8)) is None


@needs_onednn
def test_model_linear_uses_the_packed_weight_and_keeps_other_dtypes_plain():
    torch.manual_seed(2)
    w, b = torch.randn(512, 256), torch.randn(512)
    lin = Linear.make(w, b, fp8=False)
    assert lin.packed is not None
    x = torch.randn(64, 256)
    _close_to_oracle(lin(x), x, w, b)
    # the call goes through the packed copy: a packed copy of another weight shows in y
    other = torch.randn(512, 256)
    _close_to_oracle(dataclasses.replace(lin, packed=pack_weight(other))(x), x, other, b)
    # a bf16 activation (a bf16 model) never reaches the float32 packed weight
    lin16 = Linear.make(w.bfloat16(), b.bfloat16(), fp8=False)
    assert lin16.packed is None
    y16 = lin16(x.bfloat16())
    assert y16.dtype == torch.bfloat16


@needs_onednn
@pytest.mark.parametrize("rows", [65, 300, 531])
def test_rows_cut_into_pieces_match_float64(rows):
    torch.manual_seed(rows)
    w, b = torch.randn(96, 256), torch.randn(96)
    x = torch.randn(rows, 256)
    _close_to_oracle(packed_linear(x, w, pack_weight(w), b), x, w, b)


@needs_onednn
def test_every_row_count_runs_at_one_of_the_buckets():
    # oneDNN builds and caches a primitive per (weight, rows): a server's varying batch
    # sizes must map onto a fixed few, or its caches grow by ~0.6 MB per new row count.
    torch.manual_seed(3)
    w = torch.randn(72, 160)  # a shape no other test packs
    packed = pack_weight(w)
    before = packed_shapes()
    for rows in range(1, 700, 3):
        x = torch.randn(rows, 160)
        if rows * 72 * 160 >= MIN_PACKED_MACS:
            _close_to_oracle(packed_linear(x, w, packed, None), x, w, None)
    assert 0 < packed_shapes() - before <= len(ROW_BUCKETS)
    for rows in range(1, 5000):
        pieces = row_pieces(rows)
        assert set(pieces) <= set(ROW_BUCKETS)
        assert 0 <= sum(pieces) - rows <= (3 if rows < 8 else 7 if rows % 256 <= 128 else 15)
        assert len(pieces) == 1 or pieces[:-1] == [256] * (len(pieces) - 1)
