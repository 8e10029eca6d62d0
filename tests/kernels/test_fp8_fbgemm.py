"""LARGE_M_PATH's dispatch: FBGEMM GenAI's row-wise GEMM where it is installed; without it,
_scaled_mm, having said why once. (This machine has no FBGEMM: its absence is what runs.)"""

import logging

import pytest
import torch

import kernels.fp8 as fp8
from kernels import fp8_fbgemm

W_Q = torch.zeros(32, 64, dtype=torch.float8_e4m3fn)  # dimensions as GEMMs take them


@pytest.fixture
def path(monkeypatch):
    fp8_fbgemm.missing.cache_clear()
    fp8._say_once.cache_clear()
    yield lambda name: monkeypatch.setattr(fp8, "LARGE_M_PATH", name)
    fp8_fbgemm.missing.cache_clear()
    fp8._say_once.cache_clear()


def test_without_fbgemm_the_path_falls_back_to_scaled_mm_and_says_why_once(path, caplog):
    if fp8_fbgemm.missing() is None:
        pytest.skip("FBGEMM GenAI is installed here")
    path("fbgemm")
    with caplog.at_level(logging.WARNING, logger="kernels.fp8"):
        assert fp8.large_m_kernel(W_Q) is None and fp8.large_m_kernel(W_Q) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "run torch._scaled_mm instead" in said[0]
    assert "fbgemm_gpu.experimental.gen_ai is not installed" in said[0]


def test_a_package_that_does_not_import_is_named(monkeypatch, path):
    monkeypatch.setattr(fp8_fbgemm, "find_spec", lambda name: object())

    def broken(name):
        raise OSError("undefined symbol: _ZN3c10")

    monkeypatch.setattr(fp8_fbgemm, "import_module", broken)
    assert fp8_fbgemm.missing() == (
        "fbgemm_gpu.experimental.gen_ai does not import: OSError: undefined symbol: _ZN3c10"
    )


def test_each_path_picks_its_kernel(path):
    from kernels.fp8_rowwise_triton import fp8_linear_rowwise

    path("triton")
    assert fp8.large_m_kernel(W_Q) is fp8_linear_rowwise
    path("scaled_mm")
    assert fp8.large_m_kernel(W_Q) is None
    path("cutlass")
    with pytest.raises(ValueError, match="LARGE_M_PATH: expected one of"):
        fp8.large_m_kernel(W_Q)


@pytest.mark.gpu
def test_fbgemm_matches_the_dequantized_reference(path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if fp8_fbgemm.missing() is not None:
        pytest.skip(fp8_fbgemm.missing())
    w_q, scale = fp8.quantize_fp8(torch.randn(256, 512, device="cuda") / 16)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    y = fp8_fbgemm.fp8_linear_fbgemm(x, w_q, scale, None).double()
    ref = x.double() @ fp8.dequantize_fp8(w_q, scale, torch.float64).T
    assert ((y - ref).norm() / ref.norm()).item() < 0.05
