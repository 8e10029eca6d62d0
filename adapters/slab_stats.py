"""What the slab reports: its counters (SlabStats), and SlabFull when no slot is free."""

from __future__ import annotations

from dataclasses import dataclass


class SlabFull(RuntimeError):
    """Every slot is pinned or loading, so no slot can take another adapter now."""


@dataclass(frozen=True)
class SlabStats:
    """Counters since the slab was built, and how many versions are resident now."""

    loads: int  # slots filled, from the host tier or the registry
    failed_loads: int
    evictions: int  # versions evicted from a slot
    slot_hits: int  # acquires that found their version already resident
    host_hits: int  # loads served by the host tier
    registry_hits: int  # loads fetched through the loader
    host_evictions: int  # adapters dropped from the host tier
    load_seconds: float  # total wall time of the successful loads
    resident: int


COUNTED = ("loads", "failed_loads", "evictions", "slot_hits", "host_hits", "registry_hits")
