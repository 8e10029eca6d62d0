"""Tensors over a safetensors file's bytes, without copying, and a fast non-finite scan."""

from __future__ import annotations

import warnings

import torch

_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
_EXPONENT = {  # dtype -> (same-width integer view, exponent bits)
    torch.float16: (torch.int16, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float32: (torch.int32, 0x7F800000),
}


def tensor_views(data: bytes, header: dict) -> dict[str, torch.Tensor]:
    """Read-only tensors over `data` itself (no copy); the header was verified against it."""
    start = 8 + int.from_bytes(data[:8], "little")
    views = {}
    with warnings.catch_warnings():  # the bytes are immutable; nothing here writes to them
        warnings.simplefilter("ignore", UserWarning)
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            dtype = _DTYPES[entry["dtype"]]
            count = (end - begin) // dtype.itemsize
            flat = (
                torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
                if count
                else torch.empty(0, dtype=dtype)
            )
            views[name] = flat.reshape(entry["shape"])
    return views


def has_nonfinite(t: torch.Tensor) -> bool:
    """NaN or Inf anywhere: an all-ones exponent, tested on the bits (faster than isfinite)."""
    bits, mask = _EXPONENT[t.dtype]
    return bool(((t.view(bits) & mask) == mask).any())
