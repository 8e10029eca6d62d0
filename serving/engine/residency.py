"""Which adapters the engine's running sequences hold in the slab, and loads under way.

The scheduler asks `ready(version)` for each waiting request's adapter: a resident one is
pinned at once (provisionally, so no background load can evict it before the sequence that
needs it is admitted); a missing one starts loading in the background and the request waits
without holding back the ones behind it. `load_ahead` then starts the loads of the next
waiting requests' adapters, so the next steps find them resident. A full slab (SlabFull) is
never an error: the request waits, and its load is started again on a later step.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from adapters.slab import SlabFull


class Residency:
    def __init__(self, slab, on_landed: Callable[[], None] = lambda: None):
        """on_landed: called (from a loader thread) whenever a load started here settles."""
        self.slab = slab
        self.on_landed = on_landed
        self._loads: dict[str, Future] = {}  # adapter version -> its background load
        self._provisional: list[str] = []  # pinned while the scheduler decided
        self._short: set[str] = set()  # versions whose last load found no room

    def ready(self, version: str) -> bool:
        """Resident now (then pinned at once)? If not, make sure its load runs in the background."""
        if self.slab.try_acquire(version) is not None:
            self._provisional.append(version)
            self._short.discard(version)
            return True
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

    def any_loading(self) -> bool:
        return any(not load.done() for load in self._loads.values())

    def load_ahead(self, versions: list[str]) -> None:
        """Start loading versions (the next waiting requests' adapters, in their order) while
        the step runs, so the next step finds them resident.

        The resident ones are pinned first, until release_provisional, so a load that claims
        its room as it starts evicts none of them (running requests hold their own pins; a
        slab that claims room once the adapter is fetched evicts by recency, see
        release_provisional). It stops at the first one the slab has no room for: a later,
        smaller one would take the room that one waits for.
        """
        missing = []
        for version in versions:
            if self.slab.try_acquire(version) is not None:
                self._provisional.append(version)
            else:
                missing.append(version)
        for version in missing:
            if not self._start_load(version):
                return

    def pin(self, version: str) -> None:
        """Pin version for a newly admitted sequence (the scheduler's pin becomes its own)."""
        if version in self._provisional:
            self._provisional.remove(version)
        else:
            self.slab.acquire(version)  # pinned already by a running sequence: no load

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

    def slot_of(self, version: str) -> int:
        slot = self.slab.slot_of(version)
        assert slot is not None, f"{version} is pinned, so resident"
        return slot

    def _start_load(self, version: str) -> bool:
        """Make sure version's load runs in the background; False if the slab has no room."""
        load = self._loads.get(version)
        if load is None or (load.done() and _is_slab_full(load)):
            load = self._loads[version] = self.slab.prefetch(version)
            if not load.done():  # a settled one (resident, or no room) wakes no one
                load.add_done_callback(lambda _: self.on_landed())
        return not (load.done() and _is_slab_full(load))


def _is_slab_full(load: Future) -> bool:
    return isinstance(load.exception(), SlabFull)
