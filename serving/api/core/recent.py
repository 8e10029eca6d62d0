"""What the requests an app saw end in the last WINDOW_S seconds add up to, for the dashboard.

Prometheus histograms give rates and percentiles only through a scraper's queries; the
dashboard asks the server directly, so the app keeps aggregates of its recent requests and
/v1/stats reads rates and TTFT percentiles off them. Per second and per (tenant, adapter
label) there is one bucket: requests, tokens generated, and a sketch of their TTFTs
(serving.api.core.ttft_sketch), never the requests themselves. A Ray replica hands its
window to another replica's /v1/stats as Buckets inside EngineSnapshot: plain data, which
merges across replicas by adding counts and sketches.

Bounded whatever the traffic: at most `capacity` buckets, the seconds the window reaches
(window_s + 1) x KEYS_PER_SECOND, each sketch at most ttft_sketch.NUM_BINS bins (and no
more bins than requests: only bins that hold a TTFT are kept).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from serving.api.core import ttft_sketch

WINDOW_S = 30
# (tenant, adapter label) pairs with a bucket of their own in one second; the requests of
# any pair past KEYS_PER_SECOND - 1 that second share the bucket of OTHER
KEYS_PER_SECOND = 256
OTHER = ("other", "other")  # never a real pair: an adapter label is "tenant/name" or "base"


class Bucket(NamedTuple):
    """The requests of one tenant under one adapter label that ended in one second."""

    second: int  # they ended in [second, second + 1)
    tenant: str
    adapter: str  # "tenant/name", "base", or "other" (OTHER's)
    requests: int
    tokens: int  # generated
    ttft: tuple[tuple[int, int], ...]  # the sketch's (bin, count); queued items' are left out


class _Totals:
    """A bucket while its second lasts."""

    __slots__ = ("requests", "sketch", "tokens")

    def __init__(self) -> None:
        self.requests, self.tokens = 0, 0
        self.sketch: ttft_sketch.Sketch = {}


class Recent:
    """A sliding window of per-second buckets; safe to add to from several threads."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time):
        self.window_s, self._clock = window_s, clock
        self._seconds: dict[int, dict[tuple[str, str], _Totals]] = {}  # second -> key -> totals
        self._latest: int | None = None  # the second of the last add
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """The most buckets kept: the seconds the window reaches, in part or whole, times
        KEYS_PER_SECOND."""
        return (math.ceil(self.window_s) + 1) * KEYS_PER_SECOND

    def __len__(self) -> int:
        """The buckets kept now: one per (second, tenant, adapter label) with requests."""
        with self._lock:
            self._expire(self._clock())
            return sum(len(keys) for keys in self._seconds.values())

    def add(self, tenant: str, adapter: str, ttft: float | None, tokens: int) -> None:
        """Count one request that ended now; ttft None keeps it out of the percentiles."""
        with self._lock:
            now = self._clock()
            second = math.floor(now)
            # Once a second is enough: the seconds kept still number at most ceil(window_s)
            # + 1 until the next, and readers expire by their own look at the clock.
            if second != self._latest:
                self._expire(now)
                self._latest = second
            keys = self._seconds.setdefault(second, {})
            key = (tenant, adapter)
            if key not in keys and len(keys) >= KEYS_PER_SECOND - 1:
                key = OTHER  # OTHER's own bucket is the last one the second may hold
            totals = keys.get(key) or keys.setdefault(key, _Totals())
            totals.requests += 1
            totals.tokens += tokens
            if ttft is not None:
                ttft_sketch.add(totals.sketch, ttft)

    def buckets(self) -> tuple[Bucket, ...]:
        """The buckets of the seconds the window reaches, by second, tenant and label."""
        with self._lock:
            self._expire(self._clock())
            return tuple(
                Bucket(second, *key, t.requests, t.tokens, tuple(sorted(t.sketch.items())))
                for second in sorted(self._seconds)
                for key, t in sorted(self._seconds[second].items())
            )

    def _expire(self, now: float) -> None:
        # A second leaves once it ended before the window began. One later than now (the
        # clock stepped back) leaves too, so that no more seconds than `capacity` counts
        # are ever held.
        gone = [s for s in self._seconds if s + 1 <= now - self.window_s or s > now]
        for second in gone:
            del self._seconds[second]


def within(buckets: Iterable[Bucket], now: float, window_s: float) -> list[Bucket]:
    """The buckets whose second's middle lies in (now - window_s, now + 1].

    The second the window's start cuts counts whole if more than half of it is inside, else
    not at all: over steady traffic the buckets span window_s seconds on average, never
    more than half a second off. The + 1 allows a replica's clock to run 1 s ahead.
    """
    return [b for b in buckets if now - window_s < b.second + 0.5 <= now + 1.0]


def merge(windows: Iterable[Iterable[Bucket]]) -> tuple[Bucket, ...]:
    """Several windows' buckets (replicas') as one window: the requests, tokens and
    sketches of each (second, tenant, adapter label) added up."""
    groups: dict[tuple[int, str, str], list[Bucket]] = {}
    for buckets in windows:
        for b in buckets:
            groups.setdefault((b.second, b.tenant, b.adapter), []).append(b)
    return tuple(
        Bucket(
            *key,
            sum(b.requests for b in group),
            sum(b.tokens for b in group),
            tuple(sorted(ttft_sketch.merged(b.ttft for b in group).items())),
        )
        for key, group in sorted(groups.items())
    )


def rates(buckets: Iterable[Bucket], window_s: float) -> dict[str, float | None]:
    """tokens_per_s and requests_per_s over the window, and TTFT p50/p99 (None if no TTFT)."""
    buckets = list(buckets)
    sketch = ttft_sketch.merged(b.ttft for b in buckets)
    return {
        "tokens_per_s": sum(b.tokens for b in buckets) / window_s,
        "requests_per_s": sum(b.requests for b in buckets) / window_s,
        "ttft_p50_s": ttft_sketch.percentile(sketch, 50),
        "ttft_p99_s": ttft_sketch.percentile(sketch, 99),
    }
