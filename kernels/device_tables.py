"""Small constant index tables on the device, built once and reused.

The Triton launchers pass per-slice pointers, widths and offsets as tables. Built
afresh on every call, each is a blocking host-to-device copy per LoRA layer per step;
their contents are plain integers (addresses of slab stacks that never move), so the
same integers can always reuse the same device tensor.
"""

from __future__ import annotations

from functools import cache

import torch


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """t (a CPU tensor) on device; onto a GPU from pinned memory, so the host does not wait."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def device_table(values: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.tensor(values, dtype, device), cached by content."""
    return _cached(values, dtype, str(device))


# Never evicted: a captured CUDA graph reads a table at its address for as long as the graph
# lives, and an evicted table's memory would go to other tensors. The tables are a few
# per LoRA layer of each slab, tens of bytes each.
@cache
def _cached(values: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return upload(torch.tensor(values, dtype=dtype), device)
