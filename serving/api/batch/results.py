"""An OpenAI batch's output and error files and its uploaded files, sent as they are read: the
store is read a bounded page of items (or chunk of a file) at a time through the BatchClient
(serving.api.core.batch_store), over the Batch deployment's handle too, and each page
rendered in a worker thread, so neither memory nor the event loop's time grows with it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool

from adapters.errors import quoted
from serving.api.batch.format import file_lines
from serving.api.core.batch_store import BatchClient, result_pages
from serving.api.core.errors import ApiError
from serving.batch.records import Job

JSONL = "application/jsonl"
log = logging.getLogger("loraserve.batch")


async def output_lines(batch: BatchClient, tenant: str, job: Job, errors: bool):
    """The JSONL of job's output file (errors: its error file), a page of items at a time."""
    async for page in result_pages(batch, tenant, job.id):
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
