"""Finished batch jobs written straight into a store's tables (one executemany), so a test can
read the results of tens of thousands of requests without running one of them."""

import json
import time

from serving.batch.files import new_id
from serving.batch.records import CANCELLED, DONE, FAILED, OPENAI, WORKERS_AI, Job
from serving.batch.schema import JOB_COLUMNS
from serving.batch.store import BatchStore, _job_row

CHAT = "/v1/chat/completions"


def answer(api: str, i: int) -> dict:
    """Item i's stored answer: a chat completion, or a Workers-AI result (non-ASCII text in
    both, as a model writes it)."""
    text = f"réponse n° {i} — ✓ " + "word " * (i % 7)
    usage = {"prompt_tokens": 5, "completion_tokens": 3 + i % 7, "total_tokens": 8 + i % 7}
    if api == WORKERS_AI:
        return {"result": {"response": text, "usage": usage}, "success": True, "errors": []}
    return {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1_700_000_000,
            "model": "demo", "usage": usage,
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": text}}]}  # fmt: skip


def finished_job(
    store: BatchStore, n: int, *, api: str = OPENAI, tenant: str = "acme",
    failed_every: int = 0, cancelled_from: int | None = None,
) -> Job:  # fmt: skip
    """A job of n requests, ended: item i failed when failed_every divides i + 1, never ran
    (cancelled) from index cancelled_from on, else succeeded."""
    endpoint = "/ai/run" if api == WORKERS_AI else CHAT
    items, completed, failed = [], 0, 0
    for i in range(n):
        ref = f"req-{i}" if i % 3 else None  # some requests without a reference
        if cancelled_from is not None and i >= cancelled_from:
            items.append((i, ref, CANCELLED, None, None, None, 0, 0))
        elif failed_every and (i + 1) % failed_every == 0:
            failed += 1
            items.append((i, ref, FAILED, 400, None, f"request {i} is malformed", 0, 0))
        else:
            completed += 1
            items.append((i, ref, DONE, 200, json.dumps(answer(api, i)), None, 5, 3 + i % 7))
    now = time.time()
    job = Job(new_id("batch_"), tenant, "demo", api, endpoint, n, completed, failed, now - 60,
              started=now - 59, finished=now, cancelling=now if cancelled_from else None,
              prompt_tokens=5 * completed, completion_tokens=3 * completed)  # fmt: skip
    row = _job_row(job)
    with store._write() as db:
        seq = db.execute(
            f"INSERT INTO jobs (key_id, {JOB_COLUMNS}) VALUES (?, {', '.join('?' * len(row))})",
            (f"key-{tenant}", *row),
        ).lastrowid
        db.executemany(
            "INSERT INTO items (job, idx, ref, body, state, status, result, error, prompt_tokens,"
            " completion_tokens, tenant) VALUES (?, ?, ?, '{}', ?, ?, ?, ?, ?, ?, ?)",
            ((seq, *item, tenant) for item in items),
        )  # fmt: skip
    return job
