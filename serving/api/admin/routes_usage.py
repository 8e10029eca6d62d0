"""GET /v1/usage: what a tenant's requests used, by adapter, key, day or tenant.

A user key sees its own tenant's usage; an admin key sees every tenant's, or one with
`?tenant=`. `start` and `end` are ISO 8601 times (UTC unless they say otherwise) or epoch
seconds (plain ASCII decimals). The store keeps usage by the minute, so each resolves to the
start of its minute, and the range is half-open as in OpenAI's usage API: the minutes from
start's up to but not including end's. Ranges that meet therefore add up exactly: for any T,
usage up to `end=T` plus usage from `start=T` is all usage, T's minute counted once (in the
second), whether or not T is on a minute. The answer echoes `start` and `end` as given and
the resolved bounds as `start_time` and `end_time` (epoch seconds, null when open). Interactive
and batch requests are counted apart. The figures equal the sum of the `usage` fields the
answers carried, and of what requests whose clients left had been sent by then. `quotas` holds
the tenant's quotas, each used now beside its limit (null: no limit, or, for `used`, a store
that cannot be read now); null when an admin key asks for every tenant.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError
from serving.api.core.caller import Principal, authenticate, named_tenant
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.metering import TENANCY_TIMEOUT_S
from serving.api.core.quotas import holdings, quota_figures
from serving.usage.record import minute_of

log = logging.getLogger("loraserve.api")

router = APIRouter(tags=["Usage"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
When = Annotated[str | None, Query(description="ISO 8601 time or epoch seconds.")]
# Epoch seconds as plain decimals only: float() would also take "1_000", " 12 ", "1e9", "inf"
# and other scripts' digits.
NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


@router.get("/v1/usage", summary="Usage of this key's tenant (any tenant's for an admin key)")
async def usage(
    ctx: Ctx,
    caller: Caller,
    start: When = None,
    end: When = None,
    group_by: Literal["adapter", "key", "day", "tenant"] = "adapter",
    tenant: Annotated[str | None, Query(description="Admin keys: one tenant.")] = None,
):
    tenant = named_tenant(caller, tenant, "usage")
    if tenant is None and not caller.is_admin:
        tenant = caller.tenant  # an admin naming none sees every tenant's
    since, until = _time("start", start), _time("end", end)
    if since is not None and until is not None and since > until:
        raise ApiError(400, "start: it is after end")
    since = None if since is None else minute_of(since)
    until = None if until is None else minute_of(until)
    query = ctx.tenancy.usage(start=since, end=until, group_by=group_by, tenant=tenant)
    try:
        rows = await asyncio.wait_for(query, TENANCY_TIMEOUT_S)
    except Exception as exc:  # the store or the shared tenancy failed; the log says which
        log.error("usage query failed: %s", exc)
        raise ApiError(503, "the usage store cannot be read now; try again") from None
    return {
        "object": "list",
        "group_by": group_by,
        "tenant": tenant,
        "start": start,
        "end": end,
        "start_time": since,
        "end_time": until,
        "data": rows,
        "quotas": None if tenant is None else await _quotas(ctx, tenant),
    }


async def _quotas(ctx: ApiContext, tenant: str) -> dict:
    """tenant's quotas (quota_figures); a store that cannot answer in time leaves its figures
    null rather than failing the usage it does not hold."""
    try:
        held = await run_in_threadpool(holdings, ctx.settings.registry, tenant)
    except AdapterError as exc:
        log.error("usage: the registry cannot be listed: %s", exc)
        held = None
    try:
        batch = await asyncio.wait_for(ctx.batch.holdings(tenant), TENANCY_TIMEOUT_S)
    except (ApiError, TimeoutError):
        batch = None
    return quota_figures(ctx.settings.limits_of(tenant), held, batch)


def _time(field: str, text: str | None) -> float | None:
    """Epoch seconds of an ISO 8601 time or a number; 400 naming the field otherwise."""
    if text is None:
        return None
    if NUMBER.fullmatch(text):
        seconds = float(text)
        try:  # a time an ISO 8601 date could name (years 1 to 9999), so a minute in SQLite
            datetime.fromtimestamp(seconds, timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise ApiError(400, f"{field}: {text[:40]!r} is not a time") from None
        return seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            400, f"{field}: expected an ISO 8601 time or epoch seconds, got {text[:40]!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
