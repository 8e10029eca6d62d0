"""FBGEMM GenAI's row-wise FP8 GEMM for fp8_linear's larger batches, where it is installed.

    y = (x quantized per token) @ w_q.T * x_scale[m] * scale[n] (+ bias), in bfloat16

`fbgemm-gpu-genai` is a CUDA-only package and no dependency: LARGE_M_PATH "fbgemm" in
kernels/fp8.py takes it when it imports and registers its ops, and otherwise falls back to
_scaled_mm, having said once why (missing()).
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from importlib.util import find_spec

import torch

MODULE = "fbgemm_gpu.experimental.gen_ai"  # importing it registers torch.ops.fbgemm's FP8 ops
OPS = ("quantize_fp8_per_row", "f8f8bf16_rowwise")


@cache
def missing() -> str | None:
    """Why the FBGEMM path cannot run here (the package absent, or its ops unregistered);
    None when it can."""
    try:
        found = find_spec(MODULE) is not None
    except ModuleNotFoundError:  # its parent package is absent
        found = False
    if not found:
        return f"{MODULE} is not installed (pip install fbgemm-gpu-genai, on CUDA)"
    try:
        import_module(MODULE)
    except Exception as exc:  # a build for another torch or CUDA fails at import
        return f"{MODULE} does not import: {type(exc).__name__}: {exc}"
    absent = [op for op in OPS if not hasattr(torch.ops.fbgemm, op)]
    if absent:
        return f"{MODULE} registers no torch.ops.fbgemm.{absent[0]} (an older release?)"
    return None


def fp8_linear_fbgemm(
    x2d: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """y [M, N] in x's dtype = x2d [M, K] @ (w_q [N, K] * scale[:, None]).T + bias, x2d
    quantized per token by FBGEMM's own kernel; arguments already checked by kernels.fp8."""
    x_q, x_scale = torch.ops.fbgemm.quantize_fp8_per_row(x2d.contiguous())  # [M, K], [M]
    y = torch.ops.fbgemm.f8f8bf16_rowwise(x_q, w_q, x_scale, scale.to(torch.float32))
    y = y.to(x2d.dtype)  # [M, N] bfloat16 from the GEMM
    return y + bias if bias is not None else y
