"""Views of the app's metrics registry for a scrape: summed over replicas, or relabelled."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

RENAMED = ("adapter", "tenant")  # labels a scrape without an admin key sees as pseudonyms


class Summed:
    """A registry whose request metrics are the sums of every replica's samples instead."""

    def __init__(self, registry: CollectorRegistry, replicas: list[tuple]) -> None:
        self.registry = registry
        self.totals: dict[str, dict[tuple, float]] = {}  # family -> (sample, labels) -> sum
        for samples in replicas:
            for family, name, labels, value in samples:
                totals = self.totals.setdefault(family, {})
                totals[name, labels] = totals.get((name, labels), 0.0) + value

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            if family.name not in self.totals:
                yield family  # the engine figures, already from every replica
                continue
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels), value in self.totals[family.name].items():
                out.add_sample(name, dict(labels), value)
            yield out


class Relabelled:
    """A registry's metrics with every `adapter` and `tenant` label passed through rename."""

    def __init__(self, registry: CollectorRegistry, rename: Callable[[str, str], str]) -> None:
        self.registry, self.rename = registry, rename

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = dict(sample.labels)
                for key in RENAMED:
                    if key in labels:
                        labels[key] = self.rename(labels[key], key)
                out.samples.append(sample._replace(labels=labels))
            yield out
