"""Per-replica counts of requests by adapter, and whether the adapter was already resident.

"Resident on arrival" means the replica's slab held the request's adapter version in a slot
when the request reached its engine: the request paid no load. The share of such arrivals
is the measure of adapter affinity; the counts per adapter show where each adapter is
served (both in tests/serving/deploy/test_placement.py).
"""

from __future__ import annotations

from serving.engine.speculative.stats import bounded_label

MAX_LABELS = 20  # adapter names counted by name; the rest count as "other"


class Arrivals:
    """{adapter label: {"resident": n, "missing": n}}; base-only requests count as resident."""

    def __init__(self, max_labels: int = MAX_LABELS):
        self.max_labels = max_labels
        self.counts: dict[str, dict[str, int]] = {}

    def record(self, version: str | None, resident: bool) -> None:
        name = bounded_label(version, self.counts, self.max_labels)
        counts = self.counts.setdefault(name, {"resident": 0, "missing": 0})
        counts["resident" if resident else "missing"] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: dict(counts) for name, counts in self.counts.items()}


def is_resident(engine, version: str | None) -> bool:
    """Whether the engine can run version without loading it now."""
    return version is None or (engine.slab is not None and engine.slab.slot_of(version) is not None)
