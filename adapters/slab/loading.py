"""One adapter's load into the slab: joined or started, placed, written, then published.

A mixin of AdapterSlab (adapters/slab/slab.py), which sets the bookkeeping declared below
and whose one lock guards it; the pinning that starts loads lives there. A load fetches
its adapter through the host tier (adapters/slab/host_cache.py) and writes it outside the
lock, into pages reserved for it (adapters/slab/alloc.py) that no reader touches until the
load marks them resident. Whatever goes wrong, every waiter wakes with the load's error
and the pages it held are emptied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future

from adapters.format.adapter import Adapter
from adapters.slab.alloc import PageMap, Place
from adapters.slab.host_cache import HostCache
from adapters.slab.pages import PageCosts
from adapters.slab.slots import SlotContents
from adapters.slab.stats import SlabFull
from adapters.slab.tokens import SlabTokens

log = logging.getLogger("loraserve.adapters")


class SlabLoads:
    """The slab's loads and the page bookkeeping they change (under `_lock`)."""

    num_pages: int
    costs: PageCosts
    contents: SlotContents
    tokens: SlabTokens
    _lock: threading.Lock
    _host: HostCache
    _pages: PageMap
    _pins: Counter[str]
    _resident: OrderedDict[str, int]
    _loading: dict[str, Future[int]]
    _counts: Counter[str]
    _load_seconds: float
    _closed: bool

    # -- page bookkeeping (under the lock) -----------------------------------------------

    def _join_or_start(self, version: str) -> tuple[Future[int], bool]:
        """(load, started): the running load of `version`, or a new one.

        SlabFull at once where not even one page could be had (every page pinned or
        loading): then the registry is not asked for an adapter with nowhere to go. Its
        pages are claimed once it is fetched and its rank known (`_place`).
        """
        if version in self._loading:
            return self._loading[version], False
        if self._closed:
            raise RuntimeError(f"cannot load {version!r}: the adapter slab is closed")
        if not self._pages.has_room(1, self._evictable()):
            raise SlabFull(
                f"cannot load {version!r}: all {self.num_pages} adapter pages are held by "
                "pinned or loading adapters; release one first"
            )
        load: Future[int] = Future()
        load.set_running_or_notify_cancel()  # shared by every waiter: nobody may cancel it
        self._loading[version] = load
        return load, True

    def _evictable(self) -> dict[str, int]:
        """The resident, unpinned versions, each with its place in the LRU order."""
        return {v: i for i, v in enumerate(self._resident) if self._pins[v] == 0}

    def _place(self, version: str, adapter: Adapter) -> Place:
        """Reserve the pages (and token slot) `adapter` needs, evicting what must go."""
        if self._closed:
            raise RuntimeError(f"cannot load {version!r}: the adapter slab is closed")
        pages, tokens = self.costs.pages_of(adapter.rank), self.tokens.wants(adapter)
        place, going = self._pages.plan(version, pages, tokens, self._evictable())
        for victim in going:
            del self._resident[victim]
            self._counts["evictions"] += 1
            self._free(victim)
        self._pages.take(version, place)
        return place

    def _free(self, version: str) -> None:
        """Give back version's pages and token slot, emptied; its pins go with them."""
        self._pins.pop(version, None)
        place = self._pages.give_back(version)
        if place is not None:  # else it failed before it was placed
            self.contents.clear(place.slot, place.token_slot)

    # -- one load (fetched and written outside the lock, into its reserved pages) --------

    def _load(self, version: str, load: Future[int]) -> None:
        """Fetch `version`, place it and fill its pages; settle `load` with the slot or the error."""
        start = time.perf_counter()
        try:
            if self._closed:
                raise RuntimeError(f"cannot load {version!r}: the adapter slab is closed")
            adapter, tier = self._host.fetch(version)
            self.contents.check(version, adapter)
            with self._lock:
                place = self._place(version, adapter)
            self.contents.write(place.slot, adapter, place.token_slot)
            with self._lock:
                self.contents.publish(place.slot, adapter, place.token_slot)
                del self._loading[version]
                self._resident[version] = place.slot
                self._counts["loads"] += 1
                self._counts[f"{tier}_hits"] += 1
                self._load_seconds += time.perf_counter() - start
        except BaseException as exc:  # every waiter must wake, whatever went wrong
            try:
                with self._lock:
                    self._loading.pop(version, None)
                    if not isinstance(exc, SlabFull):  # refused for room, not broken
                        self._counts["failed_loads"] += 1
                    self._free(version)
            except Exception:  # the waiters still wake, with the load's own error
                log.exception("the pages of %r could not be cleared after it failed", version)
            finally:
                load.set_exception(exc)
            return
        load.set_result(place.slot)
