"""Prometheus metrics of the API: request latencies and tokens here, engine figures at scrape.

Names carry their unit (`_seconds`, `_tokens_total`, `_ratio`). The `adapter` label
(`tenant/name`, adapters.registry.names.version_label) is bounded: the first MAX_ADAPTER_LABELS adapter names that get traffic keep their own label
for the life of the process (a series cannot be renamed later without breaking rates), all
later names count as "other", and base-only requests as "base", as the engine's own
speculative-decoding figures label them. Everything lives in this app's own registry.

Adapter and tenant names are tenants' business: a scrape without an admin key (when keys
are configured) sees each as a pseudonym instead, a keyed hash that is stable across
scrapes and ingress replicas but that nobody without the keys can compute from a guess.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from adapters.format.peft_config import VARIANTS
from adapters.registry.names import version_label
from serving.api.core.metrics_engine import EngineCollector
from serving.api.core.metrics_views import Relabelled, Summed
from serving.api.core.recent import Recent
from serving.api.core.slab_rates import SlabRates
from serving.engine.snapshot import EngineSnapshot

MAX_ADAPTER_LABELS = 20
BASE, OTHER = "base", "other"
PLAIN = "plain"  # the variant label of an adapter that uses no LoRA variant
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class AdapterLabels:
    """Adapter version -> bounded metrics label."""

    def __init__(self, max_labels: int = MAX_ADAPTER_LABELS) -> None:
        self.max_labels = max_labels
        self._named: set[str] = set()

    def __call__(self, version: str | None) -> str:
        if version is None:
            return BASE
        name = version_label(version)
        if name in self._named:
            return name
        if len(self._named) < self.max_labels:
            self._named.add(name)
            return name
        return OTHER


class Metrics:
    """The app's metrics and its registry; render() reads the replicas' figures first."""

    def __init__(
        self, max_adapter_labels: int = MAX_ADAPTER_LABELS, pseudonym_key: bytes = b""
    ) -> None:
        self.pseudonym_key = pseudonym_key
        self.registry = CollectorRegistry()
        self.label = AdapterLabels(max_adapter_labels)
        reg, by_adapter = self.registry, ["adapter"]
        self.ttft = Histogram(
            "loraserve_time_to_first_token_seconds",
            "From an interactive request's arrival to its first output.",
            by_adapter,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.tpot = Histogram(
            "loraserve_time_per_output_token_seconds",
            "Mean time per output token after the first, per interactive request.",
            by_adapter,
            buckets=TPOT_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "loraserve_e2e_request_latency_seconds",
            "From an interactive request's arrival to its last output.",
            by_adapter,
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "loraserve_prompt_tokens_total",
            "Prompt tokens of requests that reached the engine (failed and aborted too).",
            by_adapter,
            registry=reg,
        )
        self.generation_tokens = Counter(
            "loraserve_generation_tokens_total",
            "Tokens generated and sent (failed and aborted requests' too).",
            by_adapter,
            registry=reg,
        )
        self.requests = Counter(
            "loraserve_requests_total",
            "Generation requests that reached the engine, by finish reason and HTTP status.",
            ["adapter", "finish_reason", "status"],
            registry=reg,
        )
        # Tenants are bounded by the keys configured, so they label without a cap.
        self.tenant_requests = Counter(
            "loraserve_tenant_requests_total",
            "Generation requests metered (finished, or left by their clients), by tenant and "
            "kind: the requests of GET /v1/usage.",
            ["tenant", "kind"],
            registry=reg,
        )
        self.tenant_tokens = Counter(
            "loraserve_tenant_tokens_total",
            "Tokens metered, by tenant, kind and type (prompt, cached, completion).",
            ["tenant", "kind", "type"],
            registry=reg,
        )
        # The variants are a fixed set (adapters.format.peft_config.VARIANTS): no cap is needed.
        self.variant_requests = Counter(
            "loraserve_adapter_variant_requests_total",
            "Generation requests with an adapter that reached the engine, once per LoRA "
            "variant the adapter uses ('plain' for none).",
            ["variant"],
            registry=reg,
        )
        self._own = (self.ttft, self.tpot, self.e2e, self.prompt_tokens, self.generation_tokens,
                     self.requests, self.tenant_requests, self.tenant_tokens,
                     self.variant_requests)  # fmt: skip
        self.recent = Recent()  # the same requests by their full adapter label, for /v1/stats
        self.slab_rates = SlabRates()  # the slab counters /v1/stats saw, for its rates
        self._engines = EngineCollector()
        reg.register(self._engines)
        # What the app keeps across requests, as loraserve_state_*: name -> a read of its
        # (entries, the most it holds or None); more are added with watch_state.
        self._states: dict[str, Callable[[], tuple[int, int | None]]] = {
            "recent_buckets": lambda: (len(self.recent), self.recent.capacity),
        }

    def observe(
        self,
        label: str,
        *,
        status: int,
        finish_reason: str,
        ttft: float | None,
        e2e: float | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """Record one request that reached the engine, when it ends; its latencies (ttft,
        e2e) only where they are given: a queued item's include its queue's wait, by design,
        and would set off latency alerts whenever a large batch runs."""
        self.requests.labels(label, finish_reason, str(status)).inc()
        self.prompt_tokens.labels(label).inc(prompt_tokens)
        self.generation_tokens.labels(label).inc(completion_tokens)
        if e2e is None:
            return
        self.e2e.labels(label).observe(e2e)
        if ttft is not None:
            self.ttft.labels(label).observe(ttft)
            if completion_tokens > 1:
                self.tpot.labels(label).observe((e2e - ttft) / (completion_tokens - 1))

    def count_variants(self, variants: tuple[str, ...]) -> None:
        """Count one request with an adapter under each LoRA variant it uses, 'plain' if none."""
        if not variants:
            self.variant_requests.labels(PLAIN).inc()
        for variant in variants:
            # A name this server does not know (a newer publisher's) keeps labels bounded.
            self.variant_requests.labels(variant if variant in VARIANTS else OTHER).inc()

    def watch_registry(self, registry) -> None:
        """Export the catalogue entries registry skipped as corrupt (its `skipped` count)."""
        self.registry.register(_SkippedEntries(registry))

    def watch_state(self, name: str, read: Callable[[], tuple[int, int | None]]) -> None:
        """Export what read() gives, (entries, the most it holds or None), as state name."""
        self._states[name] = read

    def state_sizes(self) -> dict[str, tuple[int, int | None]]:
        """The sizes of what this app keeps across requests, now (EngineSnapshot.state)."""
        return {name: read() for name, read in self._states.items()}

    def meter(self, tenant: str, kind: str, prompt: int, cached: int, completion: int) -> None:
        """Count one request's usage for its tenant, as the usage store records it."""
        self.tenant_requests.labels(tenant, kind).inc()
        for kind_of, n in (("prompt", prompt), ("cached", cached), ("completion", completion)):
            self.tenant_tokens.labels(tenant, kind, kind_of).inc(n)

    def render(self, figures: list[EngineSnapshot], *, adapter_names: bool = True) -> bytes:
        """The exposition text, with the engine gauges taken from figures; without
        adapter_names every adapter label is its pseudonym."""
        if len(figures) == 1:  # this app's own engine (or its only replica, which sent these)
            f = figures[0]
            figures = [dataclasses.replace(f, state={**self.state_sizes(), **f.state})]
        # Set and read without an await in between, so concurrent scrapes cannot mix.
        self._engines.figures = figures
        registry = self.registry
        if any(f.api for f in figures):  # every replica serves HTTP: show the sum of their apps
            registry = Summed(registry, [f.api for f in figures])
        if adapter_names:
            return generate_latest(registry)
        return generate_latest(Relabelled(registry, self.pseudonym))

    def samples(self) -> tuple[tuple[str, str, tuple, float], ...]:
        """This app's request metrics as plain data (family, sample, labels, value), for a
        scrape of another replica to add up (EngineSnapshot.api); creation times left out."""
        return tuple(
            (family.name, sample.name, tuple(sorted(sample.labels.items())), sample.value)
            for metric in self._own
            for family in metric.collect()
            for sample in family.samples
            if not sample.name.endswith("_created")
        )

    def pseudonym(self, label: str, kind: str = "adapter") -> str:
        """label's stand-in for scrapes that may not see adapter or tenant (kind) names."""
        if kind == "adapter" and label in (BASE, OTHER):
            return label
        # The kind is keyed in, so a tenant and an adapter of one name look unrelated.
        message = f"{kind}:{label}".encode()
        return f"{kind}-{hmac.new(self.pseudonym_key, message, hashlib.sha256).hexdigest()[:16]}"


class _SkippedEntries:
    """The adapter registry's count of corrupt or half-written entries it skipped."""

    def __init__(self, registry) -> None:
        self.catalogue = registry

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "loraserve_registry_skipped_entries",
            "Corrupt or half-written registry entries skipped (and logged) by this process.",
            value=self.catalogue.skipped,
        )
