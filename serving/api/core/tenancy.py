"""What the HTTP layer needs for tenants' limits and usage, and the in-process implementation.

The routes see only the TenancyClient protocol. In one process it is LocalTenancy over a
serving.usage.Tenancy; under Ray every replica's app shares one Tenancy through a handle
(serving.deploy wraps it in the same protocol), so limits hold across replicas and usage
lands in one store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from serving.usage.limits import RATE_LIMITS, Admission, Limits
from serving.usage.record import UsageRecord
from serving.usage.service import Tenancy
from serving.usage.store import UsageStore


class TenancyClient(Protocol):
    """Tenants' rate limits and usage as the HTTP layer uses them."""

    async def admit(self, tenant: str, tokens: int) -> Admission:
        """Admit a request reserving `tokens`; raises serving.usage.limits.RateLimited."""
        ...

    async def finish(
        self, admission: Admission | None, record: UsageRecord | None, tokens_used: int
    ) -> None:
        """Release an admission (if any), charging tokens_used, and record usage (if any),
        committed on return."""
        ...

    async def usage(
        self, *, start: float | None, end: float | None, group_by: str, tenant: str | None
    ) -> list[dict]:
        """Usage rows (serving.usage.store.UsageStore.query)."""
        ...

    async def window(self, tenant: str) -> dict[str, int | None]:
        """What tenant's rate limits count now (serving.usage.limits.Limiter.window)."""
        ...


class LocalTenancy:
    """A Tenancy in this process: admission under its lock, store writes in worker threads."""

    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    async def admit(self, tenant: str, tokens: int) -> Admission:
        return self.tenancy.admit(tenant, tokens)

    async def finish(
        self, admission: Admission | None, record: UsageRecord | None, tokens_used: int
    ) -> None:
        await run_in_threadpool(self.tenancy.finish, admission, record, tokens_used)

    async def usage(self, **query) -> list[dict]:
        return await run_in_threadpool(lambda: self.tenancy.usage(**query))

    async def window(self, tenant: str) -> dict[str, int | None]:
        return self.tenancy.window(tenant)  # counters under a lock: no I/O


def limits_getter(
    limits_of: Callable[[str], Mapping[str, int | None]],
) -> Callable[[str], Limits]:
    """tenant -> its rate Limits, from settings.limits_of's mapping."""

    def limits(tenant: str) -> Limits:
        given = limits_of(tenant)
        return Limits(**{key: given.get(key) for key in RATE_LIMITS})

    return limits


def rate_limited(limits: Mapping[str, int | None]) -> bool:
    """Whether any rate limit applies; when none does, requests skip admission."""
    return any(limits.get(k) is not None for k in RATE_LIMITS)


def memory_tenancy(limits_of: Callable[[str], Mapping[str, int | None]]) -> LocalTenancy:
    """Limits as configured and usage kept in memory: an app started without a store."""
    return LocalTenancy(Tenancy(UsageStore("sqlite:///:memory:"), limits_getter(limits_of)))
