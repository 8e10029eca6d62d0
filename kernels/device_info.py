"""What the launchers size their grids by: the GPU's multiprocessor count."""

from __future__ import annotations

from functools import cache

import torch


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of device (1 off CUDA: the interpreter runs one program at
    a time)."""
    if device.type != "cuda":
        return 1
    return _count(torch.cuda.current_device() if device.index is None else device.index)


@cache
def _count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
