"""Workers AI's queued requests (?queueRequest=true) as its poll answers them: progress, then
every item's response, sent a page of items at a time."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool

from serving.api.core.batch_store import BatchClient, result_pages
from serving.batch.records import ItemRecord, Job


def workers_status(job: Job, responses: object = None) -> dict:
    """The `result` of a Workers-AI poll: progress, and once finished `responses` as given
    (workers_responses' list, or a stand-in for the list sent page by page) and the usage."""
    result = {
        "status": job.state, "request_id": job.id, "model": job.model,
        "total": job.total, "completed": job.completed, "failed": job.failed,
    }  # fmt: skip
    if job.finished is None or responses is None:
        return result
    result["responses"] = responses
    result["usage"] = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.completion_tokens,
        "total_tokens": job.prompt_tokens + job.completion_tokens,
    }
    return result


def workers_responses(records: list[ItemRecord]) -> list[dict]:
    """The poll's `responses` entries of these items: one for each that has a result."""
    return [_workers_response(r) for r in records if r.result is not None]


def _workers_response(record: ItemRecord) -> dict:
    r = record.result
    answer = {"id": record.index, "success": r.ok, "external_reference": record.ref}
    if r.ok:
        answer["result"] = (r.body or {}).get("result")
    else:
        answer.update(result=None, errors=[{"code": r.status, "message": r.error}])
    return answer


async def workers_poll(batch: BatchClient, tenant: str, job: Job) -> AsyncIterator[bytes]:
    """A finished job's Workers-AI poll answer, byte for byte what JSONResponse sends for it
    whole, its `responses` rendered a page at a time."""
    marker = f"responses-{secrets.token_hex(8)}"  # where the list goes, in no other value
    whole = {"result": workers_status(job, marker), "success": True, "errors": [], "messages": []}
    head, tail = _json(whole).split(_json(marker))
    opening, separator = head + b"[", b""
    async for page in result_pages(batch, tenant, job.id):
        entries = await run_in_threadpool(_entries, page)
        if entries:
            yield opening + separator + entries
            opening, separator = b"", b","
    yield opening + b"]" + tail


def _entries(page: list[ItemRecord]) -> bytes:
    return b",".join(_json(entry) for entry in workers_responses(page))


def _json(value: object) -> bytes:
    # As starlette's JSONResponse renders a route's answer: the poll's bytes are unchanged.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")  # fmt: skip
