"""Small constant index tables on the device, built once and reused.

The Triton launchers pass per-slice pointers, widths and offsets as tables. Built
afresh on every call, each is a blocking host-to-device copy per LoRA layer per step;
their contents are plain integers (addresses of slab stacks that never move), so the
same integers can always reuse the same device tensor.
"""

from __future__ import annotations

from functools import lru_cache

import torch


def device_table(values: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.tensor(values, dtype, device), cached by content."""
    return _cached(values, dtype, str(device))


@lru_cache(maxsize=1024)
def _cached(values: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
