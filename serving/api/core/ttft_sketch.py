"""A fixed log-spaced histogram of TTFTs, whose percentiles are good to within one bin.

A sketch is plain data: a dict bin -> count (only bins that hold a TTFT), so it pickles
small and two sketches merge by adding counts bin by bin. Bin 0 holds TTFTs under LOW_S;
bin i >= 1 holds [LOW_S * GROWTH**(i-1), LOW_S * GROWTH**i), each 5% wider than the one
before, up to bin NUM_BINS - 1, which also takes every TTFT past TOP_S. A percentile is
the nearest-rank one of the counts: the bin where the rank falls is exact, and the value
read off it is the bin's geometric middle, so it differs from the exact percentile by less
than that bin's width (under 5% of the value) for TTFTs between LOW_S and TOP_S.

    bins:  [0, 1 ms)  [1, 1.05 ms)  [1.05, 1.1025 ms)  ...  [~580 s, 600 s and beyond)
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from itertools import accumulate

LOW_S = 0.001  # 1 ms: TTFTs below it share bin 0
GROWTH = 1.05  # each bin 5% wider than the one below
TOP_S = 600.0  # 10 min: TTFTs past it share the last bin
NUM_BINS = 1 + math.ceil(math.log(TOP_S / LOW_S) / math.log(GROWTH))  # 274

Sketch = dict[int, int]  # bin -> TTFTs in it


def bin_of(ttft_s: float) -> int:
    """The bin that holds a TTFT of ttft_s seconds."""
    if not ttft_s >= LOW_S:  # also NaN: a clock that stepped back gives no real TTFT
        return 0
    return min(NUM_BINS - 1, 1 + int(math.log(ttft_s / LOW_S) / math.log(GROWTH)))


def bounds(b: int) -> tuple[float, float]:
    """[low, high) of bin b, in seconds; the last bin's high is TOP_S, though it holds more."""
    if b == 0:
        return 0.0, LOW_S
    return LOW_S * GROWTH ** (b - 1), min(TOP_S, LOW_S * GROWTH**b)


def value(b: int) -> float:
    """The TTFT bin b stands for: its geometric middle (bin 0: half of LOW_S)."""
    low, high = bounds(b)
    return LOW_S / 2 if b == 0 else math.sqrt(low * high)


def add(sketch: Sketch, ttft_s: float) -> None:
    """Count one TTFT into sketch."""
    b = bin_of(ttft_s)
    sketch[b] = sketch.get(b, 0) + 1


def merged(sketches: Iterable[Mapping[int, int] | Iterable[tuple[int, int]]]) -> Sketch:
    """The sum of sketches, bin by bin; each a dict or its (bin, count) pairs."""
    total: Sketch = {}
    for s in sketches:
        for b, n in s.items() if isinstance(s, Mapping) else s:
            total[b] = total.get(b, 0) + n
    return total


def percentile(sketch: Mapping[int, int], q: float) -> float | None:
    """The q-th percentile (0..100) by the nearest-rank method, to within its bin; None when
    the sketch is empty."""
    count = sum(sketch.values())
    if not count:
        return None
    rank = min(count, max(1, math.ceil(q / 100 * count)))
    ordered = sorted(sketch)
    # the first bin whose running count reaches the rank holds the rank-th TTFT
    return value(ordered[bisect_left(list(accumulate(sketch[b] for b in ordered)), rank)])
