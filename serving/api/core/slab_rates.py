"""Adapter loads and evictions per second for /v1/stats, from the slab counters of its looks.

The slab counts since it was built (SlabStats), so a rate needs two looks. The app keeps,
per replica, the counters /v1/stats saw over the last WINDOW_S seconds (at most one look a
second), and a rate is the rise since the base look over the seconds between: the base is
the newest look at least WINDOW_S old, else the oldest kept. So a page polling every 2 s
reads the rate of the last 30 s or so, sparse polls the rate since the previous one, and the
first look none (null). Counters below the base's (the replica's slab was built anew) start
the replica afresh. Each app keeps its own looks: Ray ingress replicas answer from their own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from serving.api.core.recent import WINDOW_S
from serving.engine.snapshot import EngineSnapshot

# SlabStats counter -> the name of its rate in /v1/stats
RATED = {
    "loads": "loads_per_s",
    "evictions": "evictions_per_s",
    "registry_hits": "registry_loads_per_s",
    "host_evictions": "host_evictions_per_s",
}
MIN_GAP_S = 1.0  # looks closer than this are not kept, and no rate is taken over less


class SlabRates:
    """Per replica, the slab counters of recent looks; update() reads the rates off them."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s, self._clock = window_s, clock
        # replica -> (when, counters in RATED's order), oldest first
        self._looks: dict[str, deque[tuple[float, tuple[int, ...]]]] = {}

    def update(self, figures: list[EngineSnapshot]) -> dict[str, dict]:
        """replica -> {loads_per_s, ..., rates_over_s}: each RATED counter's rise per second
        since the base look; every figure None where there is no base a second old or more.
        Replicas serving no adapters are left out; those no longer in figures are forgotten."""
        now = self._clock()
        rates = {}
        for f in figures:
            if not f.slab:
                continue
            counts = tuple(int(f.slab.get(name, 0)) for name in RATED)
            looks = self._looks.setdefault(f.replica, deque())
            while len(looks) > 1 and looks[1][0] <= now - self.window_s:
                looks.popleft()  # the next look is old enough to be the base
            if looks and _fell(counts, looks[0][1]):
                looks.clear()  # below the base: the replica's slab was built anew
            rates[f.replica] = _rates(looks[0] if looks else None, now, counts)
            # figures below the newest look's were taken before it and answered late
            if not looks or (now - looks[-1][0] >= MIN_GAP_S and not _fell(counts, looks[-1][1])):
                looks.append((now, counts))
        for gone in self._looks.keys() - {f.replica for f in figures if f.slab}:
            del self._looks[gone]
        return rates


def _fell(counts: tuple[int, ...], seen: tuple[int, ...]) -> bool:
    return any(c < s for c, s in zip(counts, seen, strict=True))


def _rates(base: tuple[float, tuple[int, ...]] | None, now: float, counts: tuple) -> dict:
    span = now - base[0] if base else 0.0
    if span < MIN_GAP_S:
        return {**dict.fromkeys(RATED.values()), "rates_over_s": None}
    rises = (c - seen for c, seen in zip(counts, base[1], strict=True))
    return {
        **{name: rise / span for name, rise in zip(RATED.values(), rises, strict=True)},
        "rates_over_s": span,
    }
