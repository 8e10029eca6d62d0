"""The replicas' engine gauges and counters as Prometheus families, per replica, at scrape."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from serving.engine.figures import EngineFigures


class EngineCollector:
    """Gauges and counters of every replica, from the figures of the current scrape."""

    def __init__(self) -> None:
        self.figures: list[EngineFigures] = []

    def describe(self) -> Iterable[Metric]:
        return []  # the families vary with the replicas; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        def gauge(name, doc, value_of):
            family = GaugeMetricFamily(name, doc, labels=["replica"])
            for f in self.figures:
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
        yield counter(
            "loraserve_adapter_loads",
            "Adapters loaded into a slot.",
            lambda f: f.slab["loads"],
            _has_slab,
        )
        yield counter(
            "loraserve_adapter_evictions",
            "Adapters evicted from a slot.",
            lambda f: f.slab["evictions"],
            _has_slab,
        )
        family = GaugeMetricFamily(
            "loraserve_adapter_slab_occupancy_ratio",
            "Slots holding an adapter.",
            labels=["replica"],
        )
        for f in filter(_has_slab, self.figures):
            family.add_metric([f.replica], f.slab["resident"] / max(f.slab["num_slots"], 1))
        yield family
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


def _has_slab(figures: EngineFigures) -> bool:
    return bool(figures.slab)
