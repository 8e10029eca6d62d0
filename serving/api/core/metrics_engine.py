"""The replicas' engine gauges and counters as Prometheus families, per replica, at scrape."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from serving.engine.snapshot import EngineSnapshot

# (family, help, SlabStats field), per replica whose engine serves adapters. Loads count
# adapters written into the slab, from the host tier or the registry; registry loads count
# those fetched through the registry.
SLAB_COUNTERS = (
    ("loraserve_adapter_loads", "Adapters loaded into the slab.", "loads"),
    ("loraserve_adapter_registry_loads", "Adapters fetched from the registry.", "registry_hits"),
    ("loraserve_adapter_evictions", "Adapters evicted from the slab.", "evictions"),
    ("loraserve_adapter_host_evictions", "Adapters dropped from the host tier.", "host_evictions"),
)
SLAB_GAUGES = (
    ("loraserve_adapter_slab_bytes", "Bytes of the adapter slab on the device.", "slab_bytes"),
    ("loraserve_adapter_slab_used_bytes", "Slab bytes held by resident or loading adapters.",
     "slab_used_bytes"),
    ("loraserve_adapter_slab_pages", "Pages of the adapter slab.", "pages"),
    ("loraserve_adapter_slab_used_pages", "Slab pages held by resident or loading adapters.",
     "pages_used"),
    ("loraserve_adapter_host_used_bytes", "Bytes of adapters held in the host tier.",
     "host_used_bytes"),
    ("loraserve_adapter_host_entries", "Adapters held in the host tier.", "host_entries"),
)  # fmt: skip


class EngineCollector:
    """Gauges and counters of every replica, from the figures of the current scrape."""

    def __init__(self) -> None:
        self.figures: list[EngineSnapshot] = []

    def describe(self) -> Iterable[Metric]:
        return []  # the families vary with the replicas; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        def gauge(name, doc, value_of, only=lambda f: True):
            family = GaugeMetricFamily(name, doc, labels=["replica"])
            for f in filter(only, self.figures):
                family.add_metric([f.replica], value_of(f))
            return family

        def counter(name, doc, value_of, only=lambda f: True):
            family = CounterMetricFamily(name, doc, labels=["replica"])
            for f in filter(only, self.figures):
                family.add_metric([f.replica], value_of(f))
            return family

        yield gauge("loraserve_num_requests_running", "Requests running.", lambda f: f.num_running)
        yield gauge("loraserve_num_requests_waiting", "Requests waiting.", lambda f: f.num_waiting)
        yield gauge("loraserve_kv_cache_usage_ratio", "KV blocks in use.", lambda f: f.kv_usage)
        yield gauge(
            "loraserve_prefix_cache_hit_ratio",
            "Prompt tokens found in the prefix cache, of those looked up.",
            lambda f: f.prefix_cache_hit_rate,
        )
        yield counter(
            "loraserve_prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache.",
            lambda f: f.prefix_queried_tokens,
        )
        yield counter(
            "loraserve_prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache.",
            lambda f: f.prefix_hit_tokens,
        )
        yield counter(
            "loraserve_num_preemptions", "Sequences preempted.", lambda f: f.num_preemptions
        )
        for name, doc, key in SLAB_COUNTERS:
            yield counter(name, doc, lambda f, key=key: f.slab.get(key, 0), _has_slab)
        for name, doc, key in SLAB_GAUGES:
            yield gauge(name, doc, lambda f, key=key: f.slab.get(key, 0), _has_slab)
        yield gauge(
            "loraserve_adapter_host_budget_bytes",
            "Bytes the host tier may hold (replicas whose host tier has a byte budget).",
            lambda f: f.slab["host_bytes"],
            lambda f: _has_slab(f) and f.slab.get("host_bytes", 0) > 0,
        )
        yield gauge(
            "loraserve_adapter_slab_occupancy_ratio",
            "Slab pages held by resident or loading adapters.",
            lambda f: _occupancy(f.slab),
            _has_slab,
        )
        family = CounterMetricFamily(
            "loraserve_adapter_arrivals",
            "Requests reaching a replica's engine, by whether their adapter was in a slot.",
            labels=["replica", "adapter", "resident"],
        )
        for f in self.figures:
            for label, counts in sorted(f.arrivals.items()):
                for state in ("resident", "missing"):
                    family.add_metric(
                        [f.replica, label, str(state == "resident").lower()], counts[state]
                    )
        yield family
        # tokens per verification step = emitted / steps; acceptance = accepted / proposed
        for key, name, doc in (
            ("proposed", "proposed_tokens", "Draft tokens proposed."),
            ("accepted", "accepted_tokens", "Draft tokens accepted by verification."),
            ("emitted", "emitted_tokens", "Tokens emitted by verification steps."),
            ("steps", "verification_steps", "Verification steps (one per sequence and step)."),
        ):
            family = CounterMetricFamily(
                f"loraserve_spec_decode_{name}", doc, labels=["replica", "adapter"]
            )
            for f in self.figures:
                for label, counts in sorted(f.spec.items()):
                    family.add_metric([f.replica, label], counts[key])
            yield family
        family = GaugeMetricFamily(
            "loraserve_spec_decode_acceptance_ratio",
            "Accepted over proposed draft tokens since start.",
            labels=["replica", "adapter"],
        )
        for f in self.figures:
            for label, counts in sorted(f.spec.items()):
                family.add_metric(
                    [f.replica, label], counts["accepted"] / max(counts["proposed"], 1)
                )
        yield family
        yield from _states(self.figures)


def _states(figures: list[EngineSnapshot]) -> Iterable[Metric]:
    """What each replica keeps across requests (EngineSnapshot.state): its entries, and its
    bound where the bound is a number."""
    entries = GaugeMetricFamily(
        "loraserve_state_entries",
        "Entries of a cache, window or table kept across requests.",
        labels=["replica", "state"],
    )
    capacity = GaugeMetricFamily(
        "loraserve_state_capacity",
        "The most entries that state holds (none where the requests in flight bound it).",
        labels=["replica", "state"],
    )
    for f in figures:
        for name, (num, most) in sorted(f.state.items()):
            entries.add_metric([f.replica, name], num)
            if most is not None:
                capacity.add_metric([f.replica, name], most)
    yield entries
    yield capacity


def _has_slab(figures: EngineSnapshot) -> bool:
    return bool(figures.slab)


def _occupancy(slab: dict) -> float:
    """Pages used over pages; a slab that reports no pages holds one adapter a slot."""
    if slab.get("pages"):
        return slab["pages_used"] / slab["pages"]
    return slab.get("resident", 0) / max(slab.get("num_slots", 0), 1)
