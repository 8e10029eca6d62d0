"""The figures of GET /v1/stats, from the replicas' EngineSnapshot and the usage store's rows.

Pure functions over plain data, so the aggregation is tested without a server. Load figures
(running, waiting, KV use, rates, adapter memory) are the server's whoever asks; anything
named after an adapter is shown only for the adapter labels `visible` admits
("tenant/name", or "base"), and speculation counts only of the requests of the tenants
`counted` admits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from adapters.registry.names import version_label
from serving.api.core.recent import Bucket, rates, within
from serving.engine.snapshot import EngineSnapshot

NEARER = {"slab": 2, "host": 1}  # a name with versions in both tiers reads as the nearer


def replica_figures(
    f: EngineSnapshot,
    recent: list[Bucket],
    window_s: float,
    visible: Callable[[str], bool],
    counted: Callable[[str | None], bool],
    slab_rates: dict[str, dict] | None = None,
) -> dict:
    """One replica's load, rates over its recent requests' buckets and adapter memory.

    slab_slots is the slab's kernel slots, which are its pages (slab.pages); slab_used its
    adapters resident. slab_rates: replica -> its SlabRates.update() figures.
    """
    return {
        "replica": f.replica,
        "running": f.num_running,
        "waiting": f.num_waiting,
        "kv_cache_usage": f.kv_usage,
        "prefix_cache_hit_rate": _ratio(f.prefix_hit_tokens, f.prefix_queried_tokens),
        **rates(recent, window_s),
        "spec_acceptance_rate": _acceptance([f], visible, counted),
        "slab_slots": int(f.slab.get("num_slots", 0)),
        "slab_used": int(f.slab.get("resident", 0)),
        **adapter_memory(f.slab, (slab_rates or {}).get(f.replica)),
    }


def summary(
    figures: list[EngineSnapshot],
    recent: list[Bucket],
    window_s: float,
    visible,
    counted,
    slab_rates: dict[str, dict] | None = None,
) -> dict:
    """Every replica's figures added up (KV use: their mean; hit rates: of summed counts).

    recent: every replica's buckets (recent.merge); slab_rates: replica -> its
    SlabRates.update() figures.
    """
    n = len(figures)
    memory = [adapter_memory(f.slab, (slab_rates or {}).get(f.replica)) for f in figures]
    return {
        "replicas": n,
        "running": sum(f.num_running for f in figures),
        "waiting": sum(f.num_waiting for f in figures),
        "kv_cache_usage": sum(f.kv_usage for f in figures) / n if n else 0.0,
        "prefix_cache_hit_rate": _ratio(
            sum(f.prefix_hit_tokens for f in figures), sum(f.prefix_queried_tokens for f in figures)
        ),
        **rates(recent, window_s),
        "spec_acceptance_rate": _acceptance(figures, visible, counted),
        "slab": _summed([m["slab"] for m in memory if m["slab"]]),
        "host_tier": _summed([m["host_tier"] for m in memory if m["host_tier"]]),
    }


def adapter_memory(slab: dict, rates: dict | None) -> dict:
    """{"slab", "host_tier"}: the device slab's and the host tier's bytes, pages and
    counters from a replica's EngineSnapshot.slab, with the counters' rates per second
    (SlabRates.update(), None without); both None where the replica serves no adapters."""
    if not slab:
        return {"slab": None, "host_tier": None}
    rates = rates or {}
    size, used = int(slab.get("slab_bytes", 0)), int(slab.get("slab_used_bytes", 0))
    budget, held = int(slab.get("host_bytes", 0)) or None, int(slab.get("host_used_bytes", 0))
    return {
        "slab": {
            "page_rank": int(slab.get("page_rank", 0)),
            "pages": int(slab.get("pages", 0)),
            "pages_used": int(slab.get("pages_used", 0)),
            "bytes": size,
            "used_bytes": used,
            "free_bytes": size - used,
            "resident": int(slab.get("resident", 0)),
            "loads": int(slab.get("loads", 0)),
            "registry_loads": int(slab.get("registry_hits", 0)),
            "evictions": int(slab.get("evictions", 0)),
            "loads_per_s": rates.get("loads_per_s"),
            "registry_loads_per_s": rates.get("registry_loads_per_s"),
            "evictions_per_s": rates.get("evictions_per_s"),
            "rates_over_s": rates.get("rates_over_s"),
        },
        "host_tier": {
            "budget_bytes": budget,  # None: no byte budget, only a count of entries
            "used_bytes": held,
            "free_bytes": None if budget is None else budget - held,
            "entries": int(slab.get("host_entries", 0)),
            "evictions": int(slab.get("host_evictions", 0)),
            "evictions_per_s": rates.get("host_evictions_per_s"),
        },
    }


def _summed(parts: list[dict]) -> dict | None:
    """adapter_memory's slab or host-tier figures added up over replicas: a rate over those
    that have one (None if none has), any other figure None if one replica's is (a tier
    with no byte budget); the page rank and the rates' span are per replica, left out."""
    if not parts:
        return None
    total = {}
    for key in parts[0]:
        if key in ("page_rank", "rates_over_s"):
            continue
        values = [p[key] for p in parts]
        known = [v for v in values if v is not None]
        if key.endswith("_per_s"):
            total[key] = sum(known) if known else None
        else:
            total[key] = sum(values) if len(known) == len(values) else None
    return total


def adapter_figures(
    figures: list[EngineSnapshot],
    recent_of: dict[str, list[Bucket]],
    window_s: float,
    usage_hour: list[dict],
    usage_ever: list[dict],
    visible: Callable[[str], bool],
    counted: Callable[[str | None], bool],
) -> list[dict]:
    """Per adapter label that `visible` admits and that has anything to show, busiest first.

    recent_of: replica -> its recent requests' buckets, of which those of the tenants
    `counted` admits add to the rates (as their speculation counts do); usage_hour /
    usage_ever: the usage store's rows (already of those tenants) grouped by adapter over the
    last hour / all time.
    """
    rows: dict[str, dict] = {}

    def row(label: str) -> dict:
        if label not in rows:
            owner, _, name = label.rpartition("/")
            rows[label] = {
                "adapter": label, "owner": owner or None, "name": name, "residency": {},
                "tokens_per_s": 0.0, "requests_per_s": 0.0, "spec": None,
                "requests_1h": 0, "tokens_1h": 0, "last_used": None,
            }  # fmt: skip
        return rows[label]

    for f in figures:
        for version, tier in f.residency.items():
            label = version_label(version)
            if visible(label):
                held = row(label)["residency"]
                if NEARER[tier] > NEARER.get(held.get(f.replica), 0):
                    held[f.replica] = tier
        for label, counts in _spec(f, visible, counted):
            spec = row(label)["spec"] or {"proposed": 0, "accepted": 0}
            spec["proposed"] += counts["proposed"]
            spec["accepted"] += counts["accepted"]
            spec["acceptance_rate"] = _ratio(spec["accepted"], spec["proposed"])
            row(label)["spec"] = spec
    for buckets in recent_of.values():
        for b in buckets:
            if visible(b.adapter) and counted(b.tenant):
                r = row(b.adapter)
                r["tokens_per_s"] += b.tokens / window_s
                r["requests_per_s"] += b.requests / window_s
    for u in usage_hour:
        if visible(u["adapter"]):
            r = row(u["adapter"])
            r["requests_1h"] += _requests(u)
            r["tokens_1h"] += _tokens(u)
    for u in usage_ever:
        if visible(u["adapter"]):
            r = row(u["adapter"])
            r["last_used"] = max(r["last_used"] or 0, u["last_used"])
    return sorted(rows.values(), key=lambda r: (-r["tokens_per_s"], -r["tokens_1h"], r["adapter"]))


def usage_totals(rows: Iterable[dict], kinds: tuple[str, ...]) -> dict[str, int]:
    """{"requests", "tokens"} (prompt plus completion) of usage rows, over `kinds`."""
    rows = list(rows)
    return {
        "requests": sum(_requests(r, kinds) for r in rows),
        "tokens": sum(_tokens(r, kinds) for r in rows),
    }


def last_minute(rows: Iterable[dict], window: dict | None, since: float) -> dict:
    """The tenant's interactive requests and tokens (what its rate limits apply to) of late.

    Each figure is the rate limiter's count over its sliding 60 s where `window`
    (Limiter.window) has one, the count the limit holds the tenant to: requests admitted,
    tokens charged (used, or reserved while a request runs). Else it comes from the usage
    store's `rows`, whole minutes since `since`, which may cover up to 120 s.
    `source` names each figure's origin, "limiter" or "store".
    """
    stored = usage_totals(rows, ("interactive",))
    figures: dict = {"source": {}, "since": since}
    for name in ("requests", "tokens"):
        exact = (window or {}).get(name)
        figures[name] = stored[name] if exact is None else exact
        figures["source"][name] = "store" if exact is None else "limiter"
    return figures


def recent_by_replica(figures: list[EngineSnapshot], local: tuple, now: float, window_s: float):
    """replica -> the buckets of its requests ended in the window; `local` (this app's own)
    where no replica carries its app's (one process: the app is the only HTTP server)."""
    if not any(f.recent for f in figures) and len(figures) == 1:
        return {figures[0].replica: within(local, now, window_s)}
    return {f.replica: within(f.recent, now, window_s) for f in figures}


def _acceptance(figures: list[EngineSnapshot], visible, counted) -> float | None:
    proposed = accepted = 0
    for f in figures:
        for _, counts in _spec(f, visible, counted):
            proposed += counts["proposed"]
            accepted += counts["accepted"]
    return _ratio(accepted, proposed)


def _spec(f: EngineSnapshot, visible, counted):
    """(label, counts) of f's speculation on the labels visible admits, by the tenants
    counted admits: a label once per such tenant."""
    for tenant, by_label in f.spec_by_tenant.items():
        if counted(tenant):
            yield from ((label, c) for label, c in by_label.items() if visible(label))


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _requests(row: dict, kinds=("interactive", "batch")) -> int:
    return sum(row[k]["requests"] for k in kinds)


def _tokens(row: dict, kinds=("interactive", "batch")) -> int:
    return sum(row[k]["prompt_tokens"] + row[k]["completion_tokens"] for k in kinds)
