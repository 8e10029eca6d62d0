"""A batch's results and files sent as they are read: the store is read a bounded page of
items (or chunk of a file) at a time through the BatchClient, over the Batch deployment's
handle too, and each page rendered in a worker thread, so neither memory on either side nor
the event loop's time grows with the batch."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from adapters.errors import quoted
from serving.api.batch.format import file_lines, workers_responses, workers_status
from serving.api.core.batch_store import BatchClient
from serving.api.core.errors import ApiError
from serving.batch.records import ItemRecord, Job

JSONL = "application/jsonl"
log = logging.getLogger("loraserve.batch")


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


async def output_lines(batch: BatchClient, tenant: str, job: Job, errors: bool):
    """The JSONL of job's output file (errors: its error file), a page of items at a time."""
    async for page in _pages(batch, tenant, job.id):
        lines = await run_in_threadpool(file_lines, job, page, errors)
        if lines:
            yield lines


async def output_size(batch: BatchClient, tenant: str, job: Job, errors: bool) -> int:
    """The bytes of ended job's output file (errors: its error file): kept by the store once
    counted here, as the file never changes after the job ended; counted a page at a time."""
    kept = job.error_bytes if errors else job.output_bytes
    if kept is not None:
        return kept
    size = 0
    async for lines in output_lines(batch, tenant, job, errors):
        size += len(lines)
    try:
        await batch.keep_results_bytes(tenant, job.id, errors, size)
    except ApiError as exc:  # a full or unreachable store: counted again at the next read
        log.warning("batch %s: its file size cannot be kept now: %s", job.id, exc.message)
    return size


async def file_chunks(batch: BatchClient, tenant: str, file_id: str) -> AsyncIterator[bytes]:
    """An uploaded file's content, a bounded chunk at a time."""
    offset = 0
    while chunk := await batch.file_chunk(tenant, file_id, offset):
        yield chunk
        offset += len(chunk)
    if chunk is None:
        raise ApiError(404, f"file {quoted(file_id)} was deleted while it was read")


async def workers_poll(batch: BatchClient, tenant: str, job: Job) -> AsyncIterator[bytes]:
    """A finished job's Workers-AI poll answer, byte for byte what JSONResponse sends for it
    whole, its `responses` rendered a page at a time."""
    marker = f"responses-{secrets.token_hex(8)}"  # where the list goes, in no other value
    whole = {"result": workers_status(job, marker), "success": True, "errors": [], "messages": []}
    head, tail = _json(whole).split(_json(marker))
    opening, separator = head + b"[", b""
    async for page in _pages(batch, tenant, job.id):
        entries = await run_in_threadpool(_entries, page)
        if entries:
            yield opening + separator + entries
            opening, separator = b"", b","
    yield opening + b"]" + tail


async def _pages(batch: BatchClient, tenant: str, job_id: str):
    after = -1
    while page := await batch.results_page(tenant, job_id, after):
        yield page
        after = page[-1].index
    if page is None:  # deleted meanwhile: its batch.ttl_hours had passed
        raise ApiError(404, f"batch {quoted(job_id)} was deleted while its results were read")


def _entries(page: list[ItemRecord]) -> bytes:
    return b",".join(_json(entry) for entry in workers_responses(page))


def _json(value: object) -> bytes:
    # As starlette's JSONResponse renders a route's answer: the poll's bytes are unchanged.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")  # fmt: skip
