"""Where a load goes in the paged slab: which run of pages, and which trainable-token slot.

A rank-r adapter holds n = ceil(r / page_rank) contiguous pages. The run a load takes is
the lowest run of n free pages if there is one; else, among the runs whose every occupant
could be evicted (resident and unpinned), the one whose most recently used occupant is the
least recent: LRU, generalised from single slots to runs. Occupants may reach past the run
(the whole adapter goes). Fragmentation never refuses a load that evicting unpinned
adapters can place.

    owners    [None, "a", "a", None, "b", "p", None, None]     p pinned; a used before b
    n = 2     runs 0-1 {a}, 1-2 {a}, 2-3 {a}, 3-4 {b}, 6-7 {} (free)   -> 6
    n = 3     runs 0-2 {a}, 1-3 {a}, 2-4 {a, b}, 5-7 {p} (blocked)    -> 0, evicting a

Both choices are pure functions of the page owners and the evictable versions' recency,
so the slab calls them under its lock and tests call them with tables.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence

_FREE = -1


def choose_run(owners: Sequence[str | None], n: int, recency: Mapping[str, int]) -> int | None:
    """The first page of the run of n pages a load takes, or None if no run can be freed.

    owners: per page, the version holding it (None: free); recency: the evictable versions,
    each with its place in the LRU order (lower: less recently used). Versions not in
    recency (pinned or loading) block every run they touch.
    """
    # Each page's cost: -1 free, its owner's recency, or None (blocked). A run costs its
    # largest; the cheapest run, lowest first on ties, is the answer, and a free run's -1
    # beats any eviction. One pass with a monotonic deque of the window's maxima.
    costs = [_FREE if v is None else recency.get(v) for v in owners]
    best: tuple[int, int] | None = None  # (cost, first page)
    window: deque[int] = deque()  # pages of the window, their costs decreasing
    blocked_until = -1  # the last blocked page seen
    for page, cost in enumerate(costs):
        if cost is None:
            blocked_until = page
            window.clear()
            continue
        while window and costs[window[-1]] <= cost:
            window.pop()
        window.append(page)
        first = page - n + 1
        if window[0] < first:
            window.popleft()
        if first > blocked_until and first >= 0:
            run_cost = costs[window[0]]
            if best is None or run_cost < best[0]:
                best = (run_cost, first)
                if run_cost == _FREE:
                    return first  # the lowest free run: nothing is cheaper
    return None if best is None else best[1]


def choose_token_slot(
    holders: Sequence[str | None], recency: Mapping[str, int], evicting: Collection[str]
) -> int | None:
    """The trainable-token slot a load takes, or None if every one is held by a version
    that cannot be evicted.

    A free slot first; else one held by a version the load evicts anyway (`evicting`, the
    occupants of its run); else the least recently used evictable holder's.
    """
    free = next((i for i, v in enumerate(holders) if v is None), None)
    if free is not None:
        return free
    going = next((i for i, v in enumerate(holders) if v in evicting), None)
    if going is not None:
        return going
    held = [(recency[v], i) for i, v in enumerate(holders) if v in recency]
    return min(held)[1] if held else None
