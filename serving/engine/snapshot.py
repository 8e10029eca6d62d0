"""A snapshot of one engine's load and counters, as plain picklable data for metrics.

Read from another thread than the step loop without a lock: each figure is one read of a
counter or a list length, so a snapshot may mix values from two adjacent steps, which a
metrics scrape tolerates.
"""

from __future__ import annotations

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
    # what the replica keeps across requests, by name: (entries, the most it holds, or None
    # where the requests in flight bound it); the engine's (engine_states), then, on a Ray
    # replica, its app's and its routing tables
    state: dict[str, tuple[int, int | None]] = field(default_factory=dict)
