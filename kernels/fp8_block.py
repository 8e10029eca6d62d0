"""FP8 (e4m3) weights with block-wise scales, as transformers' fine-grained "fp8" checkpoints
store them (e.g. Qwen3-8B-FP8, `weight_block_size: [128, 128]`), and the linear that uses them.

    quantize_fp8_blocks:  w[i, j] ~= w_q[i, j] * scale[i // bo, j // bi]
    fp8_block_linear:     y = x @ (w_q * block scales).T  (+ bias)

`scale` is what those checkpoints call `weight_scale_inv`: despite the name it multiplies.
Its shape is [ceil(out / bo), ceil(in / bi)]; the last block of a row or column may be short.

On CUDA sm_89+ the FP8 weight streams through a Triton kernel that widens it in registers and
scales each block's partial product (kernels/fp8_block_triton.py); elsewhere the weight is
dequantized to x's dtype and multiplied normally, as fp8_linear does.
"""

from __future__ import annotations

import torch

from kernels.fp8 import _WEIGHT_DTYPES, FP8_DTYPE, FP8_MAX, _has_fp8_tensor_cores, checked_weight


def quantize_fp8_blocks(
    weight: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize w [out, in] to (w_q [out, in] float8_e4m3fn, scale [ceil(out/bo), ceil(in/bi)]
    float32) for block = (bo, bi).

    Each block's largest magnitude maps to 448 (saturating: nothing rounds to inf or NaN).
    An all-zero block gets scale 1 and zeros, never 0/0.
    """
    w = checked_weight(weight)
    bo, bi = _check_block(block)
    out_features, in_features = w.shape
    rows, cols = _cdiv(out_features, bo), _cdiv(in_features, bi)
    # Zero-padded to whole blocks (zeros never raise a block's max): [rows, bo, cols, bi].
    padded = torch.nn.functional.pad(w, (0, cols * bi - in_features, 0, rows * bo - out_features))
    amax = padded.abs().view(rows, bo, cols, bi).amax(dim=(1, 3))  # [rows, cols]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    w_q = (w / _expand(scale, block, w.shape)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w_q, scale


def dequantize_fp8_blocks(
    w_q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """w [out, in] = w_q[i, j] * scale[i // bo, j // bi], in `dtype`."""
    # float32 products round (4 significant bits times 24); float64 ones are exact.
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    s = _expand(scale.to(compute), block, w_q.shape)
    return (w_q.to(compute) * s).to(dtype)


def fp8_block_linear(
    x: torch.Tensor,
    w_q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [..., out] = x [..., in] @ (w_q * block scales).T + bias."""
    bo, bi = _check_linear(x, w_q, scale, block, bias)
    if x.is_cuda and _has_fp8_tensor_cores(x.device):
        from kernels.fp8_block_triton import fp8_block_linear_triton

        rows = x.shape[:-1].numel()
        # A bias of another dtype than x's is added after, where the addition promotes the
        # output's dtype just as the path below does.
        fused = bias is not None and bias.dtype == x.dtype
        y = fp8_block_linear_triton(
            x.reshape(rows, x.shape[-1]), w_q, scale, (bo, bi), bias if fused else None
        ).reshape(*x.shape[:-1], w_q.shape[0])
        return y + bias if bias is not None and not fused else y
    y = x @ dequantize_fp8_blocks(w_q, scale, (bo, bi), x.dtype).T
    return y + bias if bias is not None else y


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _expand(scale: torch.Tensor, block: tuple[int, int], shape) -> torch.Tensor:
    """scale [rows, cols] repeated over each block, cropped to shape [out, in]."""
    bo, bi = block
    out_features, in_features = shape
    full = scale.repeat_interleave(bo, dim=0).repeat_interleave(bi, dim=1)
    return full[:out_features, :in_features]


def _check_block(block) -> tuple[int, int]:
    if (
        not isinstance(block, (tuple, list))
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ValueError(f"block: expected two positive ints (bo, bi), got {block!r}")
    return int(block[0]), int(block[1])


def _check_linear(x, w_q, scale, block, bias) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.dtype not in _WEIGHT_DTYPES[:3]:
        raise ValueError("x: expected a float16/bfloat16/float32 tensor [..., in]")
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 2 or w_q.dtype != FP8_DTYPE:
        raise ValueError(
            "w_q: expected a float8_e4m3fn tensor [out, in] (from quantize_fp8_blocks)"
        )
    bo, bi = _check_block(block)
    out_features, in_features = w_q.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x: expected last dimension {in_features} (w_q's in), got {x.shape[-1]}")
    want = (_cdiv(out_features, bo), _cdiv(in_features, bi))
    if (
        not isinstance(scale, torch.Tensor)
        or tuple(scale.shape) != want
        or scale.dtype != torch.float32
    ):
        raise ValueError(f"scale: expected a float32 tensor of shape {want} (w_q's blocks)")
    if bias is not None and (
        not isinstance(bias, torch.Tensor)
        or tuple(bias.shape) != (out_features,)
        or not bias.dtype.is_floating_point
    ):
        raise ValueError(f"bias: expected a float tensor of shape ({out_features},)")
    for name, t in (("w_q", w_q), ("scale", scale), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(
                f"{name}: expected a tensor on {x.device} (x's device), got {t.device}"
            )
    return bo, bi
