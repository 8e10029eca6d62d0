"""A stored batch job in OpenAI's shape: its Batch object, and the JSONL lines of its output
and error files (Workers AI's poll answer is serving.api.workers_ai.queued's)."""

from __future__ import annotations

import json

from serving.api.core.errors import error_body
from serving.batch.records import CANCELLED, COMPLETION_WINDOW_S, EXPIRED, OPENAI, ItemRecord, Job

# OpenAI's batch status by the store's job state; items are checked at submission, so a job
# is in progress from the start.
OPENAI_STATUS = {"queued": "in_progress", "running": "in_progress", "done": "completed",
                 "cancelling": "cancelling", "cancelled": "cancelled",
                 "expired": "expired"}  # fmt: skip
# The error line of a request that never ran, as OpenAI writes it, by the item's state
NEVER_RAN = {
    CANCELLED: ("batch_cancelled", "the batch was cancelled before this request ran"),
    EXPIRED: ("batch_expired", "the batch's 24h completion window ended before this request "
              "ran"),
}  # fmt: skip
OUTPUT, ERRORS = "-output", "-errors"


def output_file_ids(job: Job) -> tuple[str | None, str | None]:
    """The ids of a finished job's output and error files; None for one with no lines."""
    if job.finished is None:
        return None, None
    base = "file-" + job.id.removeprefix("batch_")
    # A cancelled or expired job's requests that never ran are error lines too.
    errors = job.failed or job.total > job.completed + job.failed
    return (base + OUTPUT if job.completed else None), (base + ERRORS if errors else None)


def job_of_file(file_id: str) -> tuple[str, bool] | None:
    """(job id, whether the errors file) of an output or error file id, else None."""
    for suffix, errors in ((OUTPUT, False), (ERRORS, True)):
        if file_id.startswith("file-") and file_id.endswith(suffix):
            return "batch_" + file_id.removeprefix("file-").removesuffix(suffix), errors
    return None


def openai_batch(job: Job) -> dict:
    """OpenAI's Batch object for job."""
    output, errors = output_file_ids(job)
    state, t = job.state, _seconds
    ended = job.finished if state == "done" else None
    # A Workers-AI queued job (listed here too) has no completion window: it never expires.
    windowed = job.api == OPENAI
    expires = job.created + COMPLETION_WINDOW_S if windowed else None
    return {
        "id": job.id, "object": "batch", "endpoint": job.endpoint, "model": job.model,
        "errors": None, "input_file_id": job.input_file_id, "completion_window": "24h" if windowed else None,
        "status": OPENAI_STATUS[state], "output_file_id": output, "error_file_id": errors,
        "created_at": t(job.created), "in_progress_at": t(job.created),
        "expires_at": t(expires), "finalizing_at": t(ended),
        "completed_at": t(ended), "failed_at": None,
        "expired_at": t(job.expired if state == "expired" else None),
        "cancelling_at": t(job.cancelling),
        "cancelled_at": t(job.finished if state == "cancelled" else None),
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "metadata": job.metadata or None,
        "usage": {
            "input_tokens": job.prompt_tokens,
            "input_tokens_details": {"cached_tokens": job.cached_tokens},
            "output_tokens": job.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": job.prompt_tokens + job.completion_tokens,
        },
    }  # fmt: skip


def file_lines(job: Job, records: list[ItemRecord], errors: bool) -> bytes:
    """The JSONL lines of these items in a job's output file (its successes) or error file
    (its failures)."""
    lines = []
    for record in records:
        r = record.result
        if errors and record.state in NEVER_RAN:
            code, why = NEVER_RAN[record.state]
            line = {"id": _line_id(job, record), "custom_id": record.ref, "response": None,
                    "error": {"code": code, "message": why}}  # fmt: skip
            lines.append(json.dumps(line) + "\n")
            continue
        if r is None or r.ok == errors:
            continue
        body = r.body if r.ok or r.body else error_body(job.endpoint, r.status, r.error or "failed")
        response = {"status_code": r.status, "request_id": f"{job.id}-{record.index}", "body": body}
        line = {"id": _line_id(job, record), "custom_id": record.ref, "response": response,
                "error": None}  # fmt: skip
        lines.append(json.dumps(line) + "\n")
    return "".join(lines).encode()


def _line_id(job: Job, record: ItemRecord) -> str:
    return f"batch_req_{job.id.removeprefix('batch_')}_{record.index}"


def _seconds(t: float | None) -> int | None:
    return int(t) if t is not None else None
