"""One Batch deployment for every replica: the batch store and the feeder that runs its items.

Like the Tenancy, it is a single replica (`num_cpus: 0`) on the head node (head_node), where
batch.store names one SQLite file however often it restarts. Every ModelServer's app reaches the store
through HandleBatch (serving.api's BatchClient over the handle): submits, polls, files;
results and file contents a bounded page per call, so neither side holds a batch whole. The
feeder runs each item on some ModelServer (run_batch_item), whose app serves it through its
own route at batch priority, forwarding it to the replica where its adapter is hot; it keeps
batch.max_in_flight items running per replica, and meters each one through the Tenancy once
its result is committed (kept in the outbox beside the store while the Tenancy cannot take
it, as a replica does: HandleTenancy). On (re)start it requeues the items a dead replica left
running.
"""

from __future__ import annotations

from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from serving.api.batch.local_store import LocalBatch
from serving.api.core.batch_store import store_unreachable
from serving.api.core.errors import ApiError
from serving.batch.records import BatchHoldings, Item, ItemRecord, ItemResult, Job, StoredFile
from serving.batch.store import BatchStore
from serving.deploy.head_node import on_head_node
from serving.deploy.tenancy import HandleTenancy
from serving.usage.outbox import outbox_for


class BatchService:
    """The deployment's replica: the store, and its feeder on this replica's event loop."""

    async def __init__(
        self, store_url: str, *, max_in_flight: int, ttl_s: float, server_name: str,
        app_name: str, tenancy: DeploymentHandle | None = None, min_free_bytes: int = 0,
    ) -> None:  # fmt: skip
        store = BatchStore(store_url, min_free_bytes=min_free_bytes)
        self.batch = LocalBatch(store, max_in_flight=max_in_flight, ttl_s=ttl_s)
        self.server_name, self.app_name = server_name, app_name
        self.usage = HandleTenancy(tenancy, outbox_for(store_url)) if tenancy is not None else None
        self._servers: DeploymentHandle | None = None
        self.batch.bind(self._run, self._meter)
        self.batch.start()  # async __init__: on the loop the feeder keeps running on

    async def _run(self, item: Item) -> ItemResult:
        if self._servers is None:  # looked up late: the ModelServers are bound after this
            self._servers = serve.get_deployment_handle(self.server_name, self.app_name)
        return await self._servers.run_batch_item.remote(item)

    async def _meter(self, item: Item, result: ItemResult) -> None:
        if self.usage is not None and result.usage is not None:
            await self.usage.finish(None, result.usage, 0)

    async def submit(self, job: dict) -> Job:
        return await self.batch.submit(**job)

    async def call(self, method: str, args: tuple, kwargs: dict):
        """One of the store's read and file calls (see HandleBatch), on this replica."""
        if method not in HandleBatch.FORWARDED:
            raise ValueError(f"no batch call {method!r}")
        return await getattr(self.batch, method)(*args, **kwargs)

    def __del__(self):
        batch = getattr(self, "batch", None)
        if batch is not None:
            batch.store.close()


BatchServer = on_head_node("Batch")(BatchService)


class HandleBatch:
    """serving.api's BatchClient over the Batch deployment's handle."""

    FORWARDED = frozenset(
        {
            "job",
            "jobs",
            "results_page",
            "keep_results_bytes",
            "cancel",
            "add_file",
            "file",
            "files",
            "file_content",
            "file_chunk",
            "delete_file",
            "pending",
            "holdings",
        }
    )

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def submit(self, **job) -> Job:
        return await self._reach(self.handle.submit.remote(job))

    async def pending(self, tenant: str) -> int:
        return await self._call("pending", tenant)

    async def job(self, tenant: str, job_id: str) -> Job | None:
        return await self._call("job", tenant, job_id)

    async def jobs(self, tenant: str, *, limit: int, after: str | None) -> list[Job]:
        return await self._call("jobs", tenant, limit=limit, after=after)

    async def results_page(self, tenant: str, job_id: str, after: int) -> list[ItemRecord] | None:
        return await self._call("results_page", tenant, job_id, after)

    async def keep_results_bytes(self, tenant: str, job_id: str, errors: bool, size: int) -> None:
        await self._call("keep_results_bytes", tenant, job_id, errors, size)

    async def cancel(self, tenant: str, job_id: str) -> Job | None:
        return await self._call("cancel", tenant, job_id)

    async def add_file(
        self, tenant: str, purpose: str, filename: str, content: bytes, *,
        max_files: int | None = None, max_bytes: int | None = None,
    ) -> StoredFile:  # fmt: skip
        return await self._call("add_file", tenant, purpose, filename, content,
                                max_files=max_files, max_bytes=max_bytes)  # fmt: skip

    async def holdings(self, tenant: str) -> BatchHoldings:
        return await self._call("holdings", tenant)

    async def file(self, tenant: str, file_id: str) -> StoredFile | None:
        return await self._call("file", tenant, file_id)

    async def files(self, tenant: str, **page) -> list[StoredFile]:
        return await self._call("files", tenant, **page)

    async def file_content(self, tenant: str, file_id: str) -> bytes | None:
        return await self._call("file_content", tenant, file_id)

    async def file_chunk(self, tenant: str, file_id: str, offset: int) -> bytes | None:
        return await self._call("file_chunk", tenant, file_id, offset)

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        return await self._call("delete_file", tenant, file_id)

    async def _call(self, method: str, *args, **kwargs):
        return await self._reach(self.handle.call.remote(method, args, kwargs))

    @staticmethod
    async def _reach(response):
        """The Batch replica's answer; 503 while it is unreachable (restarting, its store
        failing), the replica's own ApiError (a 503 too) as it was raised."""
        try:
            return await response
        except RayTaskError as exc:
            if isinstance(exc.cause, ApiError):
                raise exc.cause from None
            raise store_unreachable() from None
        except (RayError, RayServeException):
            raise store_unreachable() from None
