"""The TTFT sketch against numpy: its percentiles are the exact nearest-rank ones to within
the bin that holds them, whatever the spread of the TTFTs, and its bins tile 0 to TOP_S."""

import itertools

import numpy as np
import pytest

from serving.api.core import ttft_sketch

QS = (0, 1, 25, 50, 90, 99, 99.9, 100)
SPREADS = {
    "exponential": lambda rng, n: rng.exponential(0.05, n),
    "ms to minutes": lambda rng, n: np.exp(rng.uniform(np.log(0.001), np.log(300.0), n)),
    "two modes": lambda rng, n: np.where(rng.random(n) < 0.9, 0.02, 4.0) * rng.uniform(1, 1.1, n),
    "one value": lambda rng, n: np.full(n, 0.125),
    "under 1 ms": lambda rng, n: rng.uniform(0, 0.001, n),
}


@pytest.mark.parametrize("n", [1, 7, 1000])
@pytest.mark.parametrize("spread", SPREADS)
def test_sketch_percentiles_are_numpys_to_within_a_bin(spread, n):
    ttfts = SPREADS[spread](np.random.default_rng(n), n)
    sketch = {}
    for t in ttfts:
        ttft_sketch.add(sketch, float(t))
    assert sum(sketch.values()) == n
    for q in QS:
        exact = float(np.percentile(ttfts, q, method="inverted_cdf"))  # the nearest rank
        low, high = ttft_sketch.bounds(ttft_sketch.bin_of(exact))
        got = ttft_sketch.percentile(sketch, q)
        assert abs(got - exact) < high - low, (q, exact, got)
        if exact >= ttft_sketch.LOW_S:
            assert got == pytest.approx(exact, rel=ttft_sketch.GROWTH - 1)
    assert ttft_sketch.percentile({}, 50) is None


def test_the_bins_tile_the_range_and_hold_their_values():
    edges = [ttft_sketch.bounds(b) for b in range(ttft_sketch.NUM_BINS)]
    assert edges[0][0] == 0 and edges[-1][1] == ttft_sketch.TOP_S
    assert all(a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(edges))
    for b, (low, high) in enumerate(edges):
        assert ttft_sketch.bin_of((low + high) / 2) == b
        assert low <= ttft_sketch.value(b) < high
    # past the top, and a TTFT no clock could give, still land in a bin
    assert ttft_sketch.bin_of(3600.0) == ttft_sketch.NUM_BINS - 1
    assert ttft_sketch.bin_of(float("nan")) == ttft_sketch.bin_of(-1.0) == 0
