"""What the scheduler asks of the adapters' residency (serving/engine/residency.py answers),
the gate of an engine without a slab, and why a request's adapter keeps it waiting."""

from __future__ import annotations

import enum
from typing import Protocol


class AdapterGate(Protocol):
    """What the scheduler asks of the adapters' residency (engine/residency.py)."""

    def ready(self, version: str) -> bool:
        """Resident now (then held for this step's decisions)? If not, its load is started."""

    def short_of_room(self, version: str) -> bool:
        """The slab had no room for its last load (and it has not been resident since)."""

    def load_ahead(self, versions: list[str]) -> None:
        """Start loading these, in order, as far as the slab has room for them."""


class NoAdapters:
    """The gate of an engine without a slab: no adapter is ever resident."""

    def ready(self, version: str) -> bool:
        return False

    def short_of_room(self, version: str) -> bool:
        return False

    def load_ahead(self, versions: list[str]) -> None:
        pass


class Wait(enum.Enum):
    """Why a request's adapter keeps it from joining the running sequences this step."""

    LOADING = "loading"  # its load is under way (a fetch, however long, ends)
    NO_ROOM = "no room"  # the slab had no room for its last load, or max_loras is reached
