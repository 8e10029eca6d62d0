"""The batch store in this process: a BatchStore and its feeder on this app's event loop,
running each item through the app itself (serving.api.batch.items), behind the BatchClient
protocol (serving.api.core.batch_store) the routes see."""

from __future__ import annotations

from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from serving.api.core.batch_store import log, store_full, store_unreachable
from serving.api.core.quotas import files_full, queue_full
from serving.batch.feeder import Feeder, ResultHook, Runner
from serving.batch.files import FileQuotaFull
from serving.batch.records import BatchHoldings, ItemRecord, Job, StoredFile
from serving.batch.store import BatchQueueFull, BatchStore, BatchStoreError, StoreFull


class LocalBatch:
    """A BatchStore in this process, and its feeder once start() has run on a loop."""

    def __init__(self, store: BatchStore, *, max_in_flight: int, ttl_s: float) -> None:
        self.store, self.max_in_flight, self.ttl_s = store, max_in_flight, ttl_s
        self.feeder: Feeder | None = None
        self._run: tuple[Runner, ResultHook | None] | None = None

    def bind(self, run: Runner, on_result: ResultHook | None = None) -> None:
        """What runs each item, and what meters it once committed (the app, at creation)."""
        self._run = (run, on_result)

    def start(self) -> None:
        """Start feeding on the running loop, once: requeue what a dead process left running.

        Called at the app's start-up, and by every batch call (an app served without its
        lifespan, as in tests, starts feeding at its first batch request)."""
        if self.feeder is None and self._run is not None:
            run, on_result = self._run
            self.feeder = Feeder(self.store, run, max_in_flight=self.max_in_flight,
                                 ttl_s=self.ttl_s, on_result=on_result)  # fmt: skip
            self.feeder.start()

    async def stop(self) -> None:
        if self.feeder is not None:
            await self.feeder.stop()
            self.feeder = None

    async def submit(self, **job) -> Job:
        try:
            submitted = await self._call(lambda: self.store.submit(**job))
        except BatchQueueFull as exc:
            raise queue_full(exc) from None
        if self.feeder is not None:
            self.feeder.wake()
        return submitted

    async def pending(self, tenant: str) -> int:
        return await self._call(self.store.pending, tenant)

    async def job(self, tenant: str, job_id: str) -> Job | None:
        return await self._call(self.store.job, tenant, job_id)

    async def jobs(self, tenant: str, *, limit: int, after: str | None) -> list[Job]:
        return await self._call(lambda: self.store.jobs(tenant, limit=limit, after=after))

    async def results_page(self, tenant: str, job_id: str, after: int) -> list[ItemRecord] | None:
        return await self._call(self.store.results_page, tenant, job_id, after)

    async def keep_results_bytes(self, tenant: str, job_id: str, errors: bool, size: int) -> None:
        await self._call(self.store.keep_results_bytes, tenant, job_id, errors, size)

    async def cancel(self, tenant: str, job_id: str) -> Job | None:
        return await self._call(self.store.cancel, tenant, job_id)

    async def add_file(
        self, tenant: str, purpose: str, filename: str, content: bytes, *,
        max_files: int | None = None, max_bytes: int | None = None,
    ) -> StoredFile:  # fmt: skip
        quota = {"max_files": max_files, "max_bytes": max_bytes}
        try:
            return await self._call(
                lambda: self.store.add_file(tenant, purpose, filename, content, **quota)
            )
        except FileQuotaFull as exc:
            raise files_full(exc) from None

    async def holdings(self, tenant: str) -> BatchHoldings:
        return await self._call(self.store.holdings, tenant)

    async def file(self, tenant: str, file_id: str) -> StoredFile | None:
        return await self._call(self.store.file, tenant, file_id)

    async def files(self, tenant: str, **page) -> list[StoredFile]:
        return await self._call(lambda: self.store.files(tenant, **page))

    async def file_content(self, tenant: str, file_id: str) -> bytes | None:
        return await self._call(self.store.file_content, tenant, file_id)

    async def file_chunk(self, tenant: str, file_id: str, offset: int) -> bytes | None:
        return await self._call(self.store.file_chunk, tenant, file_id, offset)

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        return await self._call(self.store.delete_file, tenant, file_id)

    async def _call(self, method: Callable, *args):
        self.start()
        try:
            return await run_in_threadpool(method, *args)
        except StoreFull as exc:
            log.error("batch store call refused: %s", exc)
            raise store_full() from None
        except BatchStoreError as exc:
            log.error("batch store call failed: %s", exc)
            raise store_unreachable() from None


def memory_batch(max_in_flight: int = 8, ttl_s: float = 72 * 3600) -> LocalBatch:
    """A batch store in memory: an app started without one (tests)."""
    return LocalBatch(BatchStore("sqlite:///:memory:"), max_in_flight=max_in_flight, ttl_s=ttl_s)
