"""One Tenancy for every replica: tenants' rate limits and the usage store, as a deployment.

Limits must hold however many replicas serve HTTP, so their counters live in one place: a
single-replica deployment (`num_cpus: 0`) that owns the limiter and writes the usage store
(usage.store, a SQLite file on the head node, where it runs). Each ModelServer's app reaches it
through HandleTenancy, the serving.api TenancyClient over a deployment handle: one call to
admit a request (only for a tenant with a rate limit) and one to record it when it ends.
A limit that refuses a request comes back as a value, not an exception, so the refusal
crosses Ray exactly as it was made.
"""

from __future__ import annotations

import asyncio
import contextvars

from ray import serve
from ray.serve.handle import DeploymentHandle

from serving.config import LimitsSection
from serving.usage.limits import Admission, RateLimited
from serving.usage.service import Tenancy, limits_from_config
from serving.usage.store import UsageRecord, UsageStore

HEAD_NODE = "node:__internal_head__"  # a resource only Ray's head node has
# Every replica's admissions and records meet here; each call is brief (a lock, a commit).
MAX_ONGOING = 1024


class TenancyService:
    """The deployment's replica: one Tenancy over the configured store and limits."""

    def __init__(self, store_url: str, limits: LimitsSection) -> None:
        self.tenancy = Tenancy(UsageStore(store_url), limits_from_config(limits))

    def admit(self, tenant: str, tokens: int) -> Admission | tuple:
        try:
            return self.tenancy.admit(tenant, tokens)
        except RateLimited as exc:
            return ("limited", exc.limit, str(exc), exc.retry_after_s, tuple(exc.headers))

    def finish(
        self, admission: Admission | None, record: UsageRecord | None, tokens_used: int
    ) -> None:
        self.tenancy.finish(admission, record, tokens_used)

    def usage(self, query: dict) -> list[dict]:
        return self.tenancy.usage(**query)

    def window(self, tenant: str) -> dict[str, int | None]:
        return self.tenancy.window(tenant)

    def __del__(self):
        tenancy = getattr(self, "tenancy", None)
        if tenancy is not None:
            tenancy.close()


TenancyServer = serve.deployment(
    name="Tenancy",
    num_replicas=1,
    # On the head node, so that usage.store names one file however often it restarts.
    ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001}},
    max_ongoing_requests=MAX_ONGOING,
)(TenancyService)


class HandleTenancy:
    """serving.api's TenancyClient over the Tenancy deployment's handle."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def admit(self, tenant: str, tokens: int) -> Admission:
        answer = await self.handle.admit.remote(tenant, tokens)
        if isinstance(answer, tuple):
            _, limit, message, retry_after_s, headers = answer
            raise RateLimited(limit, message, retry_after_s, headers)
        return answer

    async def finish(
        self, admission: Admission | None, record: UsageRecord | None, tokens_used: int
    ) -> None:
        # Made outside the request's context: Serve cancels the calls a request has in flight
        # when it cancels the request (its client left), and this one, the request's usage
        # record and its admission's release, is made just then for a client that left.
        call = self._finish(admission, record, tokens_used)
        task = asyncio.get_running_loop().create_task(call, context=contextvars.Context())
        await asyncio.shield(task)

    async def _finish(self, *args) -> None:
        await self.handle.finish.remote(*args)

    async def usage(self, **query) -> list[dict]:
        return await self.handle.usage.remote(query)

    async def window(self, tenant: str) -> dict[str, int | None]:
        return await self.handle.window.remote(tenant)
