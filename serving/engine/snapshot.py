"""A snapshot of one engine's load and counters, as plain picklable data for metrics.

Read from another thread than the step loop without a lock: each figure is one read of a
counter or a list length, so a snapshot may mix values from two adjacent steps, which a
metrics scrape tolerates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineSnapshot:
    """One replica's gauges and counters at one moment; counters only grow."""

    replica: str
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks held by running sequences
    prefix_cache_hit_rate: float  # prefix_hit_tokens / prefix_queried_tokens, 0 before any
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    # adapter label ("base", a name, or "other") -> {proposed, accepted, emitted, steps}
    spec: dict[str, dict[str, int]] = field(default_factory=dict)
    # the same counts by whose requests they are: tenant (None on a server of one user) ->
    # adapter label -> counts, so that /v1/stats shows a tenant its own traffic only
    spec_by_tenant: dict[str | None, dict[str, dict[str, int]]] = field(default_factory=dict)
    # the slab's SlabStats as a dict (its bytes, pages and counters) plus num_slots, its
    # kernel slots, which are its pages; empty when the engine serves no adapters
    slab: dict[str, float] = field(default_factory=dict)
    # adapter version -> "slab" (in a device slot) or "host" (in the CPU tier only)
    residency: dict[str, str] = field(default_factory=dict)
    # adapter label -> {resident, missing}: requests whose adapter was (not) in a slot on
    # arrival, counted by a Ray replica (serving.deploy.arrivals); empty elsewhere
    arrivals: dict[str, dict[str, int]] = field(default_factory=dict)
    # the replica's HTTP app's request metrics (serving.api.core.metrics.Metrics.samples), where
    # every replica serves HTTP; empty elsewhere
    api: tuple = ()
    # what the requests the replica's HTTP app saw end lately add up to, per second, tenant and
    # adapter label (serving.api.core.recent.Recent.buckets)
    recent: tuple = ()


def engine_snapshot(engine, replica: str) -> EngineSnapshot:
    """The figures of `engine` (a serving.engine.Engine) now, labelled with `replica`."""
    scheduler, cache = engine.scheduler, engine.blocks.stats
    spec, spec_by_tenant = {}, {}
    if engine.spec is not None:
        # list() copies a dict in one step, so a label added mid-read cannot break iteration
        for label, counts in list(engine.spec.stats.by_adapter.items()):
            spec[label] = _counts(counts)
        for (tenant, label), counts in list(engine.spec.stats.by_tenant.items()):
            spec_by_tenant.setdefault(tenant, {})[label] = _counts(counts)
    slab, residency = {}, {}
    if engine.slab is not None:
        slab = dataclasses.asdict(engine.slab.stats())
        slab["num_slots"] = engine.slab.num_slots
        # host first, so that a version in both tiers reads as the nearer one, its slot
        residency = dict.fromkeys(engine.slab.held_on_host(), "host")
        residency.update(dict.fromkeys(engine.slab.residents(), "slab"))
    return EngineSnapshot(
        replica=replica,
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        kv_usage=cache.usage,
        prefix_cache_hit_rate=cache.hit_rate,
        prefix_queried_tokens=cache.num_queried_tokens,
        prefix_hit_tokens=cache.num_hit_tokens,
        num_preemptions=scheduler.num_preemptions,
        spec=spec,
        spec_by_tenant=spec_by_tenant,
        slab=slab,
        residency=residency,
    )


def _counts(counts) -> dict[str, int]:
    """A SpecCounts as plain data."""
    return {
        "proposed": counts.proposed,
        "accepted": counts.accepted,
        "emitted": counts.emitted,
        "steps": counts.steps,
    }
