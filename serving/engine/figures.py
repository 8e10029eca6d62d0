"""An engine's figures now, read into an EngineSnapshot (serving.engine.snapshot).

Read from another thread than the step loop without a lock: each figure is one read of a
counter or a list length, so a snapshot may mix values from two adjacent steps, which a
metrics scrape tolerates. Apart from the snapshot's own module, so that what only reads
snapshots (the API, the router) does not import the engine's parts to do so.
"""

from __future__ import annotations

import dataclasses

from kernels import packed_shapes
from serving.engine.grammar.compiler import CACHE_SIZE
from serving.engine.snapshot import EngineSnapshot
from serving.engine.speculative.draft import MAX_BASE_ONLY
from serving.model.linear import packed_primitives_bound


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
        state=engine_states(engine),
    )


def engine_states(engine) -> dict[str, tuple[int, int | None]]:
    """What engine keeps across requests: its prefix cache, compiled grammars, adapters short of
    slab room, versions drafting base-only, and the process's packed CPU linears' primitives."""
    cache = engine.blocks.stats
    states: dict[str, tuple[int, int | None]] = {
        "prefix_cache_blocks": (cache.num_cached_blocks, cache.num_blocks),
        "grammar_compiles": (engine.grammars.num_cached(), CACHE_SIZE),
    }
    if engine.residency is not None:
        states["adapters_short_of_room"] = (engine.residency.num_short(), None)
    models = [engine.model]
    if engine.spec is not None and engine.spec.draft is not None:
        states["draft_base_only"] = (len(engine.spec.draft.base_only), MAX_BASE_ONLY)
        models.append(engine.spec.draft.model)
    # oneDNN's caches hold one primitive per (weight shape, row count) run packed; a GPU's
    # or an FP8 model's linears run none
    bound = packed_primitives_bound(lin for m in models for lin in _linears(m))
    if bound:
        states["cpu_gemm_primitives"] = (packed_shapes(), bound)
    return states


def _linears(model) -> list:
    """model's dense linears; none for a stand-in model without them (tests)."""
    linears = getattr(model, "linears", None)
    return linears() if linears is not None else []


def _counts(counts) -> dict[str, int]:
    """A SpecCounts as plain data."""
    return {
        "proposed": counts.proposed,
        "accepted": counts.accepted,
        "emitted": counts.emitted,
        "steps": counts.steps,
    }
