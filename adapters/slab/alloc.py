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
tested with tables; `PageMap` keeps the owners, and the slab calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from adapters.slab.stats import SlabFull

_FREE = -1


def choose_run(owners: Sequence[str | None], n: int, recency: Mapping[str, int]) -> int | None:
    """The first page of the run of n pages a load takes, or None if no run can be freed.

    owners: per page, the version holding it (None: free); recency: the evictable versions,
    each with its place in the LRU order (lower: less recently used). Versions not in
    recency (pinned or loading) block every run they touch.
    """
    if n == 1:  # the same answer without the window: the lowest free page, else the LRU's first
        if None in owners:
            return owners.index(None)
        held = [(recency[v], page) for page, v in enumerate(owners) if v in recency]
        return min(held)[1] if held else None
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


@dataclass(frozen=True)
class Place:
    """Where a version's load put it: pages [slot, slot + pages), and its token slot."""

    slot: int
    pages: int
    token_slot: int | None


class PageMap:
    """Which version holds which pages and trainable-token slot: the resident ones and those
    loading into pages reserved for them. The slab calls it holding its lock."""

    def __init__(self, num_pages: int, num_token_slots: int) -> None:
        self.owners: list[str | None] = [None] * num_pages
        self.token_holders: list[str | None] = [None] * num_token_slots
        self.places: dict[str, Place] = {}

    @property
    def pages_used(self) -> int:
        return sum(place.pages for place in self.places.values())

    def has_room(self, pages: int, evictable: Mapping[str, int]) -> bool:
        """Whether some run of `pages` is free or held by evictable versions only."""
        return choose_run(self.owners, pages, evictable) is not None

    def plan(
        self, version: str, pages: int, tokens: bool, evictable: Mapping[str, int]
    ) -> tuple[Place, set[str]]:
        """(where version goes, the versions to evict first); SlabFull if there is no room.

        tokens: whether it needs a trainable-token slot. Nothing changes until `take`.
        """
        slot = choose_run(self.owners, pages, evictable)
        if slot is None:
            raise SlabFull(
                f"cannot load {version!r}: it needs {pages} contiguous pages, and no run of "
                f"{pages} among the {len(self.owners)} is free of pinned or loading adapters; "
                "release one first"
            )
        going = {v for v in self.owners[slot : slot + pages] if v is not None}
        token_slot = None
        if tokens:
            token_slot = choose_token_slot(self.token_holders, evictable, going)
            if token_slot is None:
                raise SlabFull(
                    f"cannot load {version!r}: all {len(self.token_holders)} trainable-token "
                    "slots are held by pinned or loading adapters; release one first"
                )
            holder = self.token_holders[token_slot]
            going |= {holder} if holder is not None else set()
        return Place(slot, pages, token_slot), going

    def take(self, version: str, place: Place) -> None:
        """Record version in place (its occupants evicted already)."""
        self.owners[place.slot : place.slot + place.pages] = [version] * place.pages
        if place.token_slot is not None:
            self.token_holders[place.token_slot] = version
        self.places[version] = place

    def give_back(self, version: str) -> Place | None:
        """Free version's pages and token slot; where they were (None: it held none)."""
        place = self.places.pop(version, None)
        if place is not None:
            self.owners[place.slot : place.slot + place.pages] = [None] * place.pages
            if place.token_slot is not None:
                self.token_holders[place.token_slot] = None
        return place
