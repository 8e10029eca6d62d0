"""What the slab reports: its counters (SlabStats), and SlabFull when a load finds no room."""

from __future__ import annotations

from dataclasses import dataclass


class SlabFull(RuntimeError):
    """No run of pages (or trainable-token slot) a load needs is free of pinned or loading
    adapters, so the slab cannot take that adapter now."""


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
    # Memory, in bytes. The device slab is pages of `page_rank` rows; a rank-r adapter holds
    # ceil(r / page_rank) of them. "used" counts pages held by resident or loading adapters.
    page_rank: int = 0
    pages: int = 0
    pages_used: int = 0
    slab_bytes: int = 0
    slab_used_bytes: int = 0
    # The host tier: its byte budget (0: none but the entry count), bytes and entries held.
    host_bytes: int = 0
    host_used_bytes: int = 0
    host_entries: int = 0


COUNTED = ("loads", "failed_loads", "evictions", "slot_hits", "host_hits", "registry_hits")
