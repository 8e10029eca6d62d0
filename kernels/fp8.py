"""FP8 (e4m3) weights with per-output-channel scales, and the linear that uses them.

    quantize_fp8:  w ~= w_q.float() * scale[:, None],  w_q float8_e4m3fn, |w_q| <= 448
    fp8_linear:    y = x @ (w_q * scale[:, None]).T  (+ bias)

On CUDA sm_89+ a batch of up to SMALL_M rows streams the FP8 weight through a Triton
kernel that widens it in registers (kernels/fp8_small_m_triton.py); a larger one runs
in FP8 through `torch._scaled_mm`, with each token's activations scaled on the fly
(dynamic per-token scales), or with LARGE_M_PATH = "triton" through a Triton FP8 GEMM that
quantizes the activations inside it (kernels/fp8_rowwise_triton.py), or with "fbgemm" through
FBGEMM GenAI's row-wise GEMM where installed (kernels/fp8_fbgemm.py); elsewhere
the weight is dequantized to x's dtype and multiplied normally, which is the
same arithmetic up to the activation rounding.
"""

from __future__ import annotations

import logging
from functools import cache

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
_WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# What runs more than SMALL_M rows on sm_89+: "scaled_mm" (_scaled_mm_linear: x quantized by
# separate torch ops, each reading x, then torch._scaled_mm), "triton" (fp8_linear_rowwise:
# the quantization fused into the GEMM) or "fbgemm" (FBGEMM GenAI's row-wise GEMM, where that
# package is installed; else "scaled_mm", said once). "scaled_mm" until a GPU run measures
# them side by side (bench/gpu_checks.py, fp8_rows: "... / _scaled_mm").
LARGE_M_PATH = "scaled_mm"
LARGE_M_PATHS = ("scaled_mm", "triton", "fbgemm")
logger = logging.getLogger(__name__)


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize w [out, in] to (w_q [out, in] float8_e4m3fn, scale [out] float32).

    Each row's largest magnitude maps to 448 (saturating: nothing rounds to
    inf or NaN). An all-zero row gets scale 1 and zeros, never 0/0.
    """
    w = checked_weight(weight)
    amax = w.abs().amax(dim=1)  # [out]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    w_q = (w / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w_q, scale


def checked_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] in float32 to quantize; ValueError naming what is wrong with it."""
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected shape [out, in], got {tuple(weight.shape)}")
    if weight.dtype not in _WEIGHT_DTYPES:
        raise ValueError(
            f"weight: expected a float16/bfloat16/float32/float64 tensor, got {weight.dtype}"
        )
    w = weight.to(torch.float32)
    if not torch.isfinite(w).all():
        raise ValueError("weight: contains NaN or Inf")
    return w


def dequantize_fp8(w_q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w [out, in] = w_q * scale[:, None], in `dtype`."""
    return (w_q.to(torch.float32) * scale[:, None]).to(dtype)


def fp8_linear(
    x: torch.Tensor,
    w_q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [..., out] = x [..., in] @ (w_q * scale[:, None]).T + bias."""
    _check_linear(x, w_q, scale, bias)
    if x.is_cuda and _has_fp8_tensor_cores(x.device):
        from kernels.fp8_small_m_triton import SMALL_M, fp8_linear_small_m

        rows = x.shape[:-1].numel()
        # The Triton kernels write x's dtype: a bias of another dtype takes _scaled_mm_linear
        # or the path below, whose addition promotes the output's dtype.
        same_dtype_bias = bias is None or bias.dtype == x.dtype
        # Decode sizes: bound by reading the weight, not by the matmul.
        if rows <= SMALL_M and same_dtype_bias:
            y = fp8_linear_small_m(x.reshape(rows, x.shape[-1]), w_q, scale, bias)
            return y.reshape(*x.shape[:-1], w_q.shape[0])
        large = large_m_kernel(w_q) if rows > SMALL_M and same_dtype_bias else None
        if large is not None:
            y = large(x.reshape(rows, x.shape[-1]), w_q, scale, bias)
            return y.reshape(*x.shape[:-1], w_q.shape[0])
        if _scaled_mm_shapes_ok(w_q):
            return _scaled_mm_linear(x, w_q, scale, bias)
    y = x @ dequantize_fp8(w_q, scale, x.dtype).T
    return y + bias if bias is not None else y


def large_m_kernel(w_q: torch.Tensor):
    """The kernel LARGE_M_PATH names for more than SMALL_M rows of w_q, as fn(x2d, w_q,
    scale, bias) -> y; None for _scaled_mm_linear (as "scaled_mm", or "fbgemm" without
    FBGEMM or with w_q's dimensions not multiples of 16, which its GEMM needs too)."""
    if LARGE_M_PATH == "scaled_mm":  # the default, asked on every large linear: checked first
        return None
    if LARGE_M_PATH not in LARGE_M_PATHS:
        raise ValueError(f"LARGE_M_PATH: expected one of {LARGE_M_PATHS}, got {LARGE_M_PATH!r}")
    if LARGE_M_PATH == "triton":
        from kernels.fp8_rowwise_triton import fp8_linear_rowwise

        return fp8_linear_rowwise
    if LARGE_M_PATH == "fbgemm" and _scaled_mm_shapes_ok(w_q):
        from kernels.fp8_fbgemm import fp8_linear_fbgemm, missing

        why = missing()
        if why is None:
            return fp8_linear_fbgemm
        _say_once(
            f"LARGE_M_PATH fbgemm: FP8 linears of many rows run torch._scaled_mm instead: {why}"
        )
    return None


@cache
def _say_once(message: str) -> None:
    logger.warning(message)


def _scaled_mm_linear(x, w_q, scale, bias):
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    # Dynamic per-token activation scale: each row's max maps to the FP8 max.
    x_amax = x2.abs().amax(dim=1, keepdim=True).to(torch.float32)  # [tokens, 1]
    x_scale = torch.where(x_amax > 0, x_amax / FP8_MAX, torch.ones_like(x_amax))
    x_q = (x2.to(torch.float32) / x_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    y = torch._scaled_mm(
        x_q,
        w_q.T,  # column-major [in, out], as _scaled_mm requires for its second operand
        scale_a=x_scale,
        scale_b=scale[None, :].to(torch.float32),
        # Row-wise scaled FP8 GEMMs produce bfloat16; bias is added after, in x's dtype.
        out_dtype=torch.bfloat16,
    ).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, w_q.shape[0])


def _has_fp8_tensor_cores(device: torch.device) -> bool:
    return _capability(torch.cuda.current_device() if device.index is None else device.index) >= (
        8,
        9,
    )


@cache
def _capability(index: int) -> tuple[int, int]:
    # Asked once per device: the query costs more host time than a decode-size linear.
    return torch.cuda.get_device_capability(index)


def _scaled_mm_shapes_ok(w_q: torch.Tensor) -> bool:
    # FP8 tensor-core GEMMs need both weight dimensions to be multiples of 16.
    return w_q.shape[0] % 16 == 0 and w_q.shape[1] % 16 == 0


def _check_linear(x, w_q, scale, bias) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.dtype not in _WEIGHT_DTYPES[:3]:
        raise ValueError("x: expected a float16/bfloat16/float32 tensor [..., in]")
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 2 or w_q.dtype != FP8_DTYPE:
        raise ValueError("w_q: expected a float8_e4m3fn tensor [out, in] (from quantize_fp8)")
    out_features, in_features = w_q.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x: expected last dimension {in_features} (w_q's in), got {x.shape[-1]}")
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (out_features,):
        raise ValueError(f"scale: expected a tensor of shape ({out_features},)")
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (out_features,)
    ):
        raise ValueError(f"bias: expected a tensor of shape ({out_features},)")
    for name, t in (("w_q", w_q), ("scale", scale), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(
                f"{name}: expected a tensor on {x.device} (x's device), got {t.device}"
            )
