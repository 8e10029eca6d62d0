"""Acceptance figures, overall and per adapter, with a bounded number of adapter labels."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.registry.names import version_label

OTHER = "other"  # the label of every adapter past the first max_labels seen
BASE = "base"  # requests with no adapter


def bounded_label(adapter_version: str | None, seen, max_labels: int) -> str:
    """An adapter version's metrics label: `tenant/name`, "base", or "other" once max_labels
    other names are in seen (a collection of the labels given so far)."""
    name = BASE if adapter_version is None else version_label(adapter_version)
    if name in seen or len(seen) < max_labels:
        return name
    return OTHER


@dataclass
class SpecCounts:
    """Proposed and accepted tokens, tokens emitted by verification, verification steps."""

    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def add(self, proposed: int, accepted: int, emitted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.emitted += emitted
        self.steps += 1


@dataclass
class SpecStats:
    """Counts for the whole engine, per adapter name (at most max_labels names + "other"), and
    per (tenant, adapter name): a tenant is shown its own requests' figures only."""

    max_labels: int = 20
    total: SpecCounts = field(default_factory=SpecCounts)
    by_adapter: dict[str, SpecCounts] = field(default_factory=dict)
    # (request's tenant, None on a server of one user; label) -> counts; the tenants are the
    # configured keys' few, and the labels as bounded as by_adapter's
    by_tenant: dict[tuple[str | None, str], SpecCounts] = field(default_factory=dict)
    draft_seconds: float = 0.0  # wall time in the proposer

    def label(self, adapter_version: str | None) -> str:
        """The metrics label of an adapter version: its name, "base", or "other" past the bound."""
        return bounded_label(adapter_version, self.by_adapter, self.max_labels)

    def record(
        self,
        adapter_version: str | None,
        proposed: int,
        accepted: int,
        emitted: int,
        tenant: str | None = None,
    ) -> None:
        self.total.add(proposed, accepted, emitted)
        label = self.label(adapter_version)
        self.by_adapter.setdefault(label, SpecCounts()).add(proposed, accepted, emitted)
        self.by_tenant.setdefault((tenant, label), SpecCounts()).add(proposed, accepted, emitted)
