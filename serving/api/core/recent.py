"""The requests an app saw end in the last WINDOW_S seconds, for the dashboard's live figures.

Prometheus histograms give rates and percentiles only through a scraper's queries; the
dashboard asks the server directly, so the app keeps the recent requests themselves and
/v1/stats reads rates and exact TTFT percentiles off them. Each entry is plain data
(end time, tenant, adapter label, TTFT or None, tokens generated), so a Ray replica hands its
window to another replica's /v1/stats inside EngineSnapshot. Bounded twice: by age, and by
MAX_EVENTS however fast requests end.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

WINDOW_S = 30
MAX_EVENTS = 20_000


class Event(NamedTuple):
    """One request that ended: when, whose, under which adapter label, its TTFT, its tokens."""

    end: float
    tenant: str
    adapter: str  # "tenant/name" or "base"
    ttft: float | None  # None: kept out of the percentiles (a queued item's)
    tokens: int  # generated


class Recent:
    """A sliding window of ended requests; safe to add to from several threads."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time):
        self.window_s, self._clock = window_s, clock
        self._events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._lock = threading.Lock()

    def add(self, tenant: str, adapter: str, ttft: float | None, tokens: int) -> None:
        """Record one request that ended now; ttft None keeps it out of the percentiles."""
        with self._lock:
            now = self._clock()
            self._events.append(Event(now, tenant, adapter, ttft, tokens))
            self._expire(now)

    def events(self) -> tuple[Event, ...]:
        """The requests that ended within the window, oldest first."""
        with self._lock:
            self._expire(self._clock())
            return tuple(self._events)

    def _expire(self, now: float) -> None:
        while self._events and self._events[0].end <= now - self.window_s:
            self._events.popleft()


def within(events: Iterable[Event], now: float, window_s: float) -> list[Event]:
    """The events that ended in (now - window_s, now]."""
    return [e for e in events if now - window_s < e.end <= now + 1.0]  # 1 s of clock skew


def rates(events: list[Event], window_s: float) -> dict[str, float | None]:
    """tokens_per_s and requests_per_s over the window, and TTFT p50/p99 (None if no TTFT)."""
    ttfts = sorted(e.ttft for e in events if e.ttft is not None)
    return {
        "tokens_per_s": sum(e.tokens for e in events) / window_s,
        "requests_per_s": len(events) / window_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
    }


def percentile(ordered: list[float], q: float) -> float | None:
    """The q-th percentile of sorted values by the nearest-rank method; None when empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
