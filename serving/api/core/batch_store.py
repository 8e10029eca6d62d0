"""What the HTTP layer needs from the batch store: the BatchClient protocol, its errors, and
its results read a bounded page at a time.

The routes see only the protocol. In one process it is serving.api.batch.local_store's
LocalBatch; under Ray one Batch deployment owns the store and the feeder for every replica,
and serving.deploy wraps its handle in the same protocol. Both the OpenAI batch wing and
Workers AI's queued requests read their results through it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from fastapi.responses import StreamingResponse

from adapters.errors import quoted
from serving.api.core.errors import ApiError
from serving.batch.records import BatchHoldings, ItemRecord, Job, NewItem, StoredFile

log = logging.getLogger("loraserve.batch")
UNREACHABLE = "the batch store cannot be reached now; retry shortly"


def store_unreachable() -> ApiError:
    """The 503 of a batch call whose store failed (a full disk, a restarting replica)."""
    return ApiError(503, UNREACHABLE, headers={"Retry-After": "1"})


def store_full() -> ApiError:
    """The 507 of a new file or batch while the store's disk is (nearly) full."""
    return ApiError(
        507, "the batch store's disk is nearly full: new files and batches are refused until "
        "space is freed (deleting files frees it); reads, cancels and deletes still work",
        code="insufficient_storage",
    )  # fmt: skip


class BatchClient(Protocol):
    """The batch store as the routes use it; every call is scoped to one tenant."""

    async def submit(
        self, *, tenant: str, key_id: str, model: str, api: str, endpoint: str,
        items: Sequence[NewItem], input_file_id: str | None = None, metadata: dict | None = None,
        max_pending: int | None = None,
    ) -> Job: ...  # fmt: skip

    async def pending(self, tenant: str) -> int: ...

    async def job(self, tenant: str, job_id: str) -> Job | None: ...

    async def jobs(self, tenant: str, *, limit: int, after: str | None) -> list[Job]: ...

    async def results_page(self, tenant: str, job_id: str, after: int) -> list[ItemRecord] | None:
        """BatchStore.results_page: the job's next bounded page of items after index after."""
        ...

    async def keep_results_bytes(self, tenant: str, job_id: str, errors: bool, size: int) -> None:
        """BatchStore.keep_results_bytes: an ended job's measured output (or error) file size."""
        ...

    async def cancel(self, tenant: str, job_id: str) -> Job | None: ...

    async def add_file(
        self, tenant: str, purpose: str, filename: str, content: bytes, *,
        max_files: int | None = None, max_bytes: int | None = None,
    ) -> StoredFile:  # fmt: skip
        """BatchStore.add_file: 429 past the file quotas, 507 on a (nearly) full disk."""
        ...

    async def holdings(self, tenant: str) -> BatchHoldings:
        """BatchStore.holdings: what the tenant's batch quotas count now."""
        ...

    async def file(self, tenant: str, file_id: str) -> StoredFile | None: ...

    async def files(self, tenant: str, **page) -> list[StoredFile]:
        """page: BatchStore.files' purpose, limit, after and ascending."""
        ...

    async def file_content(self, tenant: str, file_id: str) -> bytes | None: ...

    async def file_chunk(self, tenant: str, file_id: str, offset: int) -> bytes | None:
        """BatchStore.file_chunk: a bounded piece of the file's content from offset."""
        ...

    async def delete_file(self, tenant: str, file_id: str) -> bool: ...


async def streamed(
    chunks: AsyncIterator[bytes], media_type: str, headers: dict | None = None
) -> StreamingResponse:
    """chunks as a response, its first one read now: a store that fails at once answers with
    its error (a 503, a 404), not a 200 cut off; a later failure cuts the answer off."""
    first = await anext(chunks, b"")

    async def rest() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(rest(), media_type=media_type, headers=headers)


async def result_pages(
    batch: BatchClient, tenant: str, job_id: str
) -> AsyncIterator[list[ItemRecord]]:
    """A job's items with results, a bounded page at a time; 404 once the job is deleted."""
    after = -1
    while page := await batch.results_page(tenant, job_id, after):
        yield page
        after = page[-1].index
    if page is None:  # deleted meanwhile: its batch.ttl_hours had passed
        raise ApiError(404, f"batch {quoted(job_id)} was deleted while its results were read")
