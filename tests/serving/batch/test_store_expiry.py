"""OpenAI batches past their completion window: queued items expire and never run, running
ones finish and are kept, the job ends `expired`; Workers-AI and cancelled jobs are left
alone, and a store file made before jobs could expire opens and reads as before."""

import sqlite3
import time

from serving.batch.records import (
    DONE,
    EXPIRED,
    OPENAI,
    QUEUED,
    RUNNING,
    WORKERS_AI,
    ItemResult,
    NewItem,
)
from serving.batch.store import BatchStore

WINDOW_S = 3600.0


def submit(store, n, api=OPENAI, tenant="acme"):
    items = [NewItem({"messages": [{"role": "user", "content": str(i)}]}, ref=f"r{i}")
             for i in range(n)]  # fmt: skip
    return store.submit(tenant=tenant, key_id="k", model="demo", api=api,
                        endpoint="/v1/chat/completions", items=items)  # fmt: skip


def states(store, job):
    return [r.state for r in store.results("acme", job.id)]


def test_an_overdue_job_expires_its_queued_items_and_ends_when_the_running_do(store):
    job = submit(store, 5)
    first, second = store.claim(2)
    store.finish(first, ItemResult(200, {"ok": 1}, None, 3, 2, 0))
    later = job.created + WINDOW_S + 1
    assert store.close_overdue(WINDOW_S, now=job.created + WINDOW_S - 1) == 0
    assert states(store, job) == [DONE, RUNNING, QUEUED, QUEUED, QUEUED]
    assert store.close_overdue(WINDOW_S, now=later) == 1
    assert states(store, job) == [DONE, RUNNING, EXPIRED, EXPIRED, EXPIRED]
    expiring = store.job("acme", job.id)
    assert expiring.state == RUNNING and expiring.expired == later and expiring.finished is None
    assert store.pending("acme") == 1  # the running item only
    assert store.claim(10) == []
    assert store.close_overdue(WINDOW_S, now=later + 5) == 0  # closed once
    assert store.finish(second, ItemResult(500, error="boom")) is True
    ended = store.job("acme", job.id)
    assert (ended.state, ended.completed, ended.failed, ended.dropped) == ("expired", 1, 1, 3)
    assert ended.finished is not None and store.pending("acme") == 0
    assert store.cancel("acme", job.id).cancelling is None  # an ended job: as it was


def test_a_job_with_nothing_running_ends_expired_at_once(store):
    job = submit(store, 3)
    assert store.close_overdue(WINDOW_S, now=time.time() + 2 * WINDOW_S) == 1
    ended = store.job("acme", job.id)
    assert ended.state == "expired" and ended.finished is not None and ended.dropped == 3


def test_workers_ai_and_cancelled_jobs_never_expire(store):
    workers = submit(store, 2, api=WORKERS_AI)
    cancelling = submit(store, 2)
    store.claim(2)  # one item of each job runs
    store.cancel("acme", cancelling.id)
    assert store.close_overdue(WINDOW_S, now=time.time() + 2 * WINDOW_S) == 0
    assert store.job("acme", workers.id).expired is None
    assert store.job("acme", cancelling.id).state in ("cancelling", "cancelled")


def test_a_running_item_of_an_expired_job_is_dropped_after_a_crash(store):
    job = submit(store, 3)
    store.claim(1)
    store.close_overdue(WINDOW_S, now=time.time() + 2 * WINDOW_S)
    assert store.requeue_running().requeued == 0
    assert states(store, job) == [EXPIRED] * 3
    assert store.job("acme", job.id).state == "expired" and store.claim(5) == []


def test_a_store_file_from_before_expiry_opens_and_reads_as_before(url):
    old = BatchStore(url)
    job = submit(old, 2)
    old.close()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as raw:
        raw.execute("ALTER TABLE jobs DROP COLUMN expired")  # the file as an older version left it
    store = BatchStore(url)
    try:
        assert store.job("acme", job.id) == job and job.expired is None
        assert store.close_overdue(WINDOW_S, now=time.time() + 2 * WINDOW_S) == 1
        assert store.job("acme", job.id).state == "expired"
    finally:
        store.close()
