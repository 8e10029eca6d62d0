"""Timing helpers for the benchmarks: medians of repeated calls, and the machine's copy bandwidth."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(
    fn: Callable[[], object], *, min_time: float = 0.3, max_reps: int = 200
) -> float:
    """Median wall time of fn() over repeated calls, after warm-up calls."""
    for _ in range(3):
        fn()
    _sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_seconds(
    fns: dict[str, Callable[[], object]], *, rounds: int = 5
) -> dict[str, float]:
    """Median seconds of each fn, measured in alternating rounds so that all see the same machine.

    The host is shared: its memory bandwidth drifts by 2x over minutes, so timings that are
    compared (a ratio) are taken interleaved, never one after the other.
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(median_seconds(fn, min_time=0.05, max_reps=50))
    return {name: statistics.median(v) for name, v in samples.items()}


def replayed(fn: Callable[[], object], repeats: int, device: str) -> Callable[[], object]:
    """A callable running fn `repeats` times: on CUDA one replay of a graph capturing them all,
    so its time over repeats is the kernels' own, without the host's launch costs (which a
    decode step replayed from graphs does not pay either)."""
    if device != "cuda":
        return lambda: [fn() for _ in range(repeats)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles and caches outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return graph.replay


def copier(device: str = "cpu", nbytes: int = 256 * 2**20) -> tuple[Callable[[], object], int]:
    """A large tensor copy, well beyond the caches, and the bytes it moves (read + write)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * nbytes


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
