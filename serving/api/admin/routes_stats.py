"""GET /v1/stats: what the dashboard polls, per replica and summed, scoped by the key.

Load figures are the whole server's; per-adapter figures cover only the adapters the key
may see (its tenant's and the public ones; all for an admin key), and of those only its
tenant's requests (rates, speculation: every tenant's for an admin key); usage is its tenant's.
`key` names the key's own tenant and scope, so the page offers only what the key may do.
The last minute's requests and tokens are those the tenant's rate limits count (the
limiter's sliding 60 s) where a limit keeps them; the usage store's minutes cannot show a
sliding window, and the page names the window each figure covers.
The shape is documented in docs/dashboard.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError
from serving.api.admin.stats import (
    adapter_figures,
    last_minute,
    recent_by_replica,
    replica_figures,
    summary,
    usage_totals,
)
from serving.api.core.caller import Principal, authenticate, named_tenant
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.metering import TENANCY_TIMEOUT_S
from serving.api.core.metrics import BASE
from serving.api.core.quotas import MB, holdings
from serving.api.core.recent import WINDOW_S, merge
from serving.api.core.tenancy import rate_limited
from serving.config import TenantLimitsSection
from serving.usage.record import minute_of

log = logging.getLogger("loraserve.api")

router = APIRouter(tags=["Operations"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
HOUR_S, MINUTE_S = 3600.0, 60.0
# every limit a tenant may have: the keys of its `limits:` section, in their order
LIMITS = tuple(TenantLimitsSection.model_fields)


@router.get("/v1/stats", summary="Live figures per replica and summed, for the dashboard")
async def stats(
    ctx: Ctx,
    caller: Caller,
    tenant: Annotated[str | None, Query(description="Admin keys: whose usage.")] = None,
):
    tenant = named_tenant(caller, tenant, "figures") or caller.tenant
    now = time.time()
    figures = await ctx.generator.figures()
    # at once, so that the rates' clock reads when the figures came
    slab_rates = ctx.metrics.slab_rates.update(figures)
    visible = await _visibility(ctx, caller)
    recent_of = recent_by_replica(figures, ctx.metrics.recent.buckets(), now, WINDOW_S)
    # An admin's per-adapter traffic and usage are every tenant's; a user key's, its own.
    scope = tenant if not caller.is_admin else None
    limited = rate_limited(ctx.settings.limits_of(tenant))
    hour, ever, minute, window = await asyncio.gather(
        _usage(ctx, start=now - HOUR_S, tenant=scope),
        _usage(ctx, start=None, tenant=scope),
        _usage(ctx, start=now - MINUTE_S, tenant=tenant),
        _window(ctx, tenant) if limited else _none(),
    )
    own_hour = [row for row in hour if row["tenant"] == tenant]  # the rows carry their tenant
    recent = last_minute(minute, window, minute_of(now - MINUTE_S))
    everything = merge(recent_of.values())
    counted = _counted(caller)
    return {
        "object": "stats",
        "time": now,
        "window_s": WINDOW_S,
        "tenant": tenant,
        "key": {"tenant": caller.tenant, "scope": caller.scope},
        "summary": summary(figures, everything, WINDOW_S, visible, counted, slab_rates),
        "replicas": [
            replica_figures(f, recent_of.get(f.replica, []), WINDOW_S, visible, counted, slab_rates)
            for f in figures
        ],
        "adapters": adapter_figures(
            figures, recent_of, WINDOW_S, hour, ever, visible, counted=counted
        ),
        "usage": await _tenant_usage(ctx, tenant, recent, own_hour),
    }


async def _visibility(ctx: ApiContext, caller: Principal):
    """label -> whether caller may see the adapter: every one for an admin key."""
    if caller.is_admin:
        return lambda label: True
    try:
        entries = await run_in_threadpool(ctx.settings.registry.list_visible, caller.tenant)
    except AdapterError as exc:
        log.error("stats: the registry cannot be listed: %s", exc)
        raise ApiError(503, "the adapter registry cannot be read now; try again") from None
    labels = {f"{e.owner}/{e.name}" for e in entries} | {BASE}
    return labels.__contains__


def _counted(caller: Principal):
    """tenant -> whether its requests count in caller's per-adapter and speculation figures."""
    return (lambda tenant: True) if caller.is_admin else (lambda tenant: tenant == caller.tenant)


async def _usage(ctx: ApiContext, *, start: float | None, tenant: str | None) -> list[dict]:
    """Usage rows by adapter since start; 503 when the store cannot be read."""
    return await _ask(ctx.tenancy.usage(start=start, end=None, group_by="adapter", tenant=tenant))


async def _window(ctx: ApiContext, tenant: str) -> dict:
    """What tenant's rate limits count now; 503 when the shared tenancy cannot be reached."""
    return await _ask(ctx.tenancy.window(tenant))


async def _ask(query):
    try:
        return await asyncio.wait_for(query, TENANCY_TIMEOUT_S)
    except Exception as exc:  # the store or the shared tenancy failed; the log says which
        log.error("stats: usage query failed: %s", exc)
        raise ApiError(503, "the usage store cannot be read now; try again") from None


async def _none() -> None:
    return None


async def _tenant_usage(ctx: ApiContext, tenant: str, minute: dict, hour: list) -> dict:
    """tenant's usage (its last minute's figures, its rows of the last hour) beside its
    limits, the adapters it holds and its batch requests not yet ended."""
    limits = ctx.settings.limits_of(tenant)
    try:
        held = await run_in_threadpool(holdings, ctx.settings.registry, tenant)
    except AdapterError as exc:
        log.error("stats: the registry cannot be listed: %s", exc)
        raise ApiError(503, "the adapter registry cannot be read now; try again") from None
    return {
        "tenant": tenant,
        "last_minute": minute,
        "last_hour": usage_totals(hour, ("interactive", "batch")),
        "limits": {key: limits.get(key) for key in LIMITS},
        "adapters": len(held.names),
        "adapter_mb": round(sum(held.sizes.values()) / MB, 3),
        "batch_pending": await _batch_pending(ctx, tenant),
    }


async def _batch_pending(ctx: ApiContext, tenant: str) -> int | None:
    """tenant's batch requests not yet ended; None while the batch store cannot answer in the
    page's time (a restarting Batch replica): the rest of the page still can."""
    try:
        return await asyncio.wait_for(ctx.batch.pending(tenant), TENANCY_TIMEOUT_S)
    except (ApiError, TimeoutError):
        return None
