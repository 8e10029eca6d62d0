"""EngineSnapshot.slab as serving.engine.figures.engine_snapshot builds it (a SlabStats as a
dict, plus num_slots), with the figures a test names and every other counter 0."""

import dataclasses

from adapters.slab.stats import COUNTED, SlabStats


def slab_figures(**fields) -> dict:
    """A slab's figures: `fields` of SlabStats set, the rest 0; num_slots is its pages."""
    zeros = dict.fromkeys((*COUNTED, "host_evictions", "resident"), 0)
    stats = SlabStats(**{**zeros, "load_seconds": 0.0, **fields})
    return {**dataclasses.asdict(stats), "num_slots": stats.pages}
