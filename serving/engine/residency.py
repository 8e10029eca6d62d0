"""Which adapters the engine's running sequences hold in the slab, and loads under way.

The scheduler asks `ready(version)` for each waiting request's adapter: a resident one is
pinned at once (provisionally, so no background load can evict it before the sequence that
needs it is admitted); a missing one starts loading in the background and the request waits
without holding back the ones behind it. `load_ahead` then starts the loads of the next
waiting requests' adapters, so the next steps find them resident. A load starts only while
the slab has room beside the adapters pinned and loading: more would evict one another. A
full slab (SlabFull) is never an error: the request waits, short of room, and its load is
started again on a later step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future

from adapters.slab.stats import SlabFull


class Residency:
    def __init__(self, slab, on_landed: Callable[[], None] = lambda: None):
        """on_landed: called (from a loader thread) whenever a load started here settles."""
        self.slab = slab
        self.on_landed = on_landed
        self._loads: dict[str, Future] = {}  # adapter version -> its background load
        self._provisional: list[str] = []  # pinned while the scheduler decided
        # versions whose last load found no room, of requests in flight only (keep_short)
        self._short: set[str] = set()
        self._running: Counter[str] = Counter()  # versions pinned by admitted sequences

    def ready(self, version: str) -> bool:
        """Resident now (then pinned at once)? If not, its load runs in the background, if
        the slab has room for it (else it is short of room)."""
        if self.slab.try_acquire(version) is not None:
            self._provisional.append(version)
            self._short.discard(version)
            return True
        if not self._loading(version):
            self._start_load(version)
        return False

    def short_of_room(self, version: str) -> bool:
        """Whether version's last load found no room (every page it could take pinned or
        loading), and it has not been resident since: its request waits for room, not for a
        fetch. The slab may learn this only once the adapter is fetched and its size known,
        so a load under way again still counts as short until it lands."""
        load = self._loads.get(version)
        if load is not None and load.done() and _is_slab_full(load):
            self._short.add(version)
        return version in self._short

    def wait_loads(self, timeout: float) -> None:
        """Block (the GIL released) until every load under way has landed, or timeout."""
        pending = [load for load in self._loads.values() if not load.done()]
        if pending:
            futures.wait(pending, timeout=timeout)

    def any_loading(self) -> bool:
        return self._num_loading() > 0

    def load_ahead(self, versions: list[str]) -> None:
        """Start loading versions (the next waiting requests' adapters, in their order) while
        the step runs, so the next step finds them resident.

        In one pass, in their order: a resident one is pinned (until release_provisional),
        so no load started after it evicts it; a missing one starts loading, which may evict
        only what no running or earlier waiting request holds (a slab that claims room only
        once the adapter is fetched evicts by recency, see release_provisional). It goes on
        while the slab has room, one adapter a slot (at least a page) beside those pinned
        and those loading, and stops at the first load the slab refuses, whose room a later,
        smaller one would take.
        """
        for version in versions:
            if self.slab.try_acquire(version) is not None:
                self._provisional.append(version)
            elif not self._loading(version) and not self._start_load(version):
                return

    def pin(self, version: str) -> None:
        """Pin version for a newly admitted sequence (the scheduler's pin becomes its own)."""
        if version in self._provisional:
            self._provisional.remove(version)
        else:
            self.slab.acquire(version)  # pinned already by a running sequence: no load
        self._running[version] += 1

    def release_provisional(self) -> None:
        """Drop the pins taken for sequences that were not admitted after all."""
        # Last in, first released: a release marks its adapter most recently used, so the
        # earliest waiting request's adapter is the last a later load evicts (a slab that
        # places a load only once it is fetched evicts by that order, not by these pins).
        for version in reversed(self._provisional):
            self.slab.release(version)
        self._provisional.clear()

    def unpin(self, version: str) -> None:
        self.slab.release(version)
        self._running -= Counter({version: 1})  # drops it at 0

    def broken_loads(self) -> list[tuple[str, BaseException]]:
        """Loads that failed for good since the last call (a full slab is retried instead)."""
        broken = []
        for version, load in list(self._loads.items()):
            if not load.done():
                continue
            del self._loads[version]
            error = load.exception()
            if error is None:
                self._short.discard(version)
            elif _is_slab_full(load):
                self._short.add(version)
            else:
                broken.append((version, error))
        return broken

    def keep_short(self, wanted: set[str]) -> None:
        """Forget that a version was short of room unless it is in wanted (the adapters of
        the requests in flight): a version no request waits for any more is no one's concern,
        and without this the set would keep every version ever turned away that never loaded."""
        self._short &= wanted

    def num_short(self) -> int:
        """Versions remembered as short of room."""
        return len(self._short)

    def slot_of(self, version: str) -> int:
        slot = self.slab.slot_of(version)
        assert slot is not None, f"{version} is pinned, so resident"
        return slot

    def _num_loading(self) -> int:
        return sum(not load.done() for load in self._loads.values())

    def _loading(self, version: str) -> bool:
        load = self._loads.get(version)
        return load is not None and not load.done()

    def _room(self) -> int:
        """How many more adapters the slab may take now, one a slot (each takes a page at
        least), beside those pinned (running, or held for this step's decisions) and those
        loading. A slab whose adapters take several pages each may still refuse one."""
        held = set(self._running) | set(self._provisional)
        return self.slab.num_slots - len(held) - self._num_loading()

    def _start_load(self, version: str) -> bool:
        """Start version's load in the background; False if the slab has no room for it.

        Without room no load starts: each would evict the one before it once fetched."""
        load = self._loads.get(version)
        if load is not None and load.done() and not _is_slab_full(load):
            return True  # landed, or broken: broken_loads reports it this step
        if self._room() <= 0:
            self._short.add(version)
            return False
        load = self._loads[version] = self.slab.prefetch(version)
        if not load.done():  # a settled one (resident, or no room) wakes no one
            load.add_done_callback(lambda _: self.on_landed())
        return not (load.done() and _is_slab_full(load))


def _is_slab_full(load: Future) -> bool:
    return isinstance(load.exception(), SlabFull)
