"""Which adapters the engine's running sequences hold in the slab, and loads under way.

The scheduler asks `ready(version)` for each waiting request's adapter: a resident one is
pinned at once (provisionally, so no background load can evict it before the sequence that
needs it is admitted); a missing one starts loading in the background and the request waits
without holding back the ones behind it.
"""

from __future__ import annotations

from concurrent.futures import Future

from adapters.slab import SlabFull


class Residency:
    def __init__(self, slab):
        self.slab = slab
        self._loads: dict[str, Future] = {}  # adapter version -> its background load
        self._provisional: list[str] = []  # pinned while the scheduler decided

    def ready(self, version: str) -> bool:
        """Resident now (then pinned at once)? If not, make sure its load runs in the background."""
        if self.slab.try_acquire(version) is not None:
            self._provisional.append(version)
            return True
        load = self._loads.get(version)
        if load is None or (load.done() and _is_slab_full(load)):
            self._loads[version] = self.slab.prefetch(version)
        return False

    def pin(self, version: str) -> None:
        """Pin version for a newly admitted sequence (the scheduler's pin becomes its own)."""
        if version in self._provisional:
            self._provisional.remove(version)
        else:
            self.slab.acquire(version)  # pinned already by a running sequence: no load

    def release_provisional(self) -> None:
        """Drop the pins taken for sequences that were not admitted after all."""
        for version in self._provisional:
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
            if error is not None and not _is_slab_full(load):
                broken.append((version, error))
        return broken

    def slot_of(self, version: str) -> int:
        slot = self.slab.slot_of(version)
        assert slot is not None, f"{version} is pinned, so resident"
        return slot


def _is_slab_full(load: Future) -> bool:
    return isinstance(load.exception(), SlabFull)
