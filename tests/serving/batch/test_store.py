"""The batch store on a real SQLite file: what a submit commits, the order items are taken in,
results committed once, cancel, expiry, tenants kept apart, and items a dead feeder left."""

import dataclasses
import sqlite3
import time

import pytest

from serving.batch.records import (
    CANCELLED,
    DONE,
    FAILED,
    QUEUED,
    RUNNING,
    WORKERS_AI,
    ItemResult,
    NewItem,
)
from serving.batch.store import BatchStore, BatchStoreError


def submit(store, n, tenant="acme", name="job", **extra):
    items = [NewItem({"prompt": f"{name} {i}"}, ref=f"{name}-{i}") for i in range(n)]
    return store.submit(tenant=tenant, key_id=f"key-{tenant}", model="demo", api=WORKERS_AI,
                        endpoint="/ai/run", items=items, **extra)  # fmt: skip


def ok(n=0):
    return ItemResult(200, {"response": f"answer {n}"}, None, 3, n, 1)


def states(store, job, tenant="acme"):
    return [r.state for r in store.results(tenant, job.id)]


def test_a_submit_is_invisible_to_other_connections_until_it_returns(store, url):
    """Another connection (another process's store) sees nothing while submit's transaction is
    open, and the whole job, every item queued, once submit has returned."""
    other = BatchStore(url)
    seen_at_commit = []

    def trace(sql):
        if sql == "COMMIT":  # traced as it begins: the transaction is not committed yet
            seen_at_commit.append(other.jobs("acme"))

    store._db.set_trace_callback(trace)
    job = submit(store, 5)
    store._db.set_trace_callback(None)
    assert seen_at_commit == [[]]
    assert other.job("acme", job.id) == job
    assert [r.ref for r in other.results("acme", job.id)] == [f"job-{i}" for i in range(5)]
    assert states(other, job) == [QUEUED] * 5
    other.close()


def test_claims_take_the_ith_item_of_every_job_before_any_jobs_next(store):
    """A small job submitted after a large one is not stuck behind it; claimed items are
    running, carry their body and reference, and are not handed out again."""
    big, mid, small = submit(store, 3, name="big"), submit(store, 2, name="mid"), submit(store, 1)
    taken = store.claim(2) + store.claim(1) + store.claim(10)
    assert [(t.job_id, t.index) for t in taken] == [
        (big.id, 0), (mid.id, 0), (small.id, 0), (big.id, 1), (mid.id, 1), (big.id, 2),
    ]  # fmt: skip
    assert taken[3].body == {"prompt": "big 1"} and taken[3].ref == "big-1"
    assert (taken[0].tenant, taken[0].key_id, taken[0].model) == ("acme", "key-acme", "demo")
    assert store.claim(10) == [] and store.queued() == 0
    assert states(store, big) == [RUNNING] * 3
    assert store.job("acme", big.id).state == RUNNING


def test_tenants_take_turns_however_many_jobs_each_has(store):
    """Four jobs of one tenant do not get four times the turns of another's one job: the
    tenants alternate (the older first) until one has nothing queued."""
    acme = [submit(store, 3, name=f"a{k}") for k in range(4)]
    globex = submit(store, 3, tenant="globex", name="g")
    taken = store.claim(4) + store.claim(1) + store.claim(20)
    assert [t.tenant for t in taken] == ["acme", "globex"] * 3 + ["acme"] * 9
    assert [(t.job_id, t.index) for t in taken if t.tenant == "globex"] == [
        (globex.id, 0), (globex.id, 1), (globex.id, 2),
    ]  # fmt: skip
    mine = [(t.job_id, t.index) for t in taken if t.tenant == "acme"]
    assert mine == [(job.id, i) for i in range(3) for job in acme]  # within a tenant, as before


def test_the_tenant_with_fewest_items_running_goes_first(store):
    submit(store, 4, name="a1")
    assert [t.tenant for t in store.claim(2)] == ["acme"] * 2  # alone: it takes both
    submit(store, 4, name="a2")
    submit(store, 4, tenant="globex", name="g")
    # globex catches up with acme's two running items; the tie goes to the older tenant
    taken = store.claim(4)
    assert [t.tenant for t in taken] == ["globex", "globex", "acme", "globex"]
    assert taken[2].ref == "a2-0"


def test_a_result_is_committed_once_and_a_second_finish_changes_nothing(store):
    """finish() of an item that already has its result returns False and leaves the result,
    the job's counts and its token totals as the first finish wrote them."""
    job = submit(store, 2)
    first, second = store.claim(2)
    assert store.finish(first, ok(7)) is True
    before = store.job("acme", job.id)
    assert store.finish(first, ok(8)) is False
    assert store.finish(first, ItemResult(500, error="late")) is False
    after = store.job("acme", job.id)
    assert after == before
    assert (after.completed, after.failed, after.completion_tokens, after.prompt_tokens) == (
        1, 0, 7, 3,
    )  # fmt: skip
    assert store.results("acme", job.id)[0].result == ok(7)
    assert after.finished is None and after.state == RUNNING  # the second item still runs
    assert store.finish(second, ok(1)) is True
    assert store.job("acme", job.id).state == "done"


def test_a_failed_item_counts_as_failed_and_keeps_its_error(store):
    job = submit(store, 2)
    good, bad = store.claim(2)
    store.finish(good, ok(2))
    store.finish(bad, ItemResult(404, error="unknown adapter 'x'"))
    done = store.job("acme", job.id)
    assert (done.completed, done.failed, done.state) == (1, 1, "done")
    record = store.results("acme", job.id)[1]
    assert record.state == FAILED
    assert (record.result.status, record.result.error, record.result.body) == (
        404, "unknown adapter 'x'", None,
    )  # fmt: skip


def test_cancel_drops_queued_items_and_keeps_what_running_ones_return(store):
    """Cancelling leaves the job 'cancelling' while items run; their results are kept, the
    queued ones are never handed out, and the job is 'cancelled' once the running end."""
    job = submit(store, 5)
    running = store.claim(2)
    cancelling = store.cancel("acme", job.id)
    assert cancelling.state == "cancelling" and cancelling.finished is None
    assert states(store, job) == [RUNNING] * 2 + [CANCELLED] * 3
    assert store.claim(10) == []
    assert store.finish(running[0], ok(1)) is True
    assert store.finish(running[1], ItemResult(500, error="boom")) is True
    ended = store.job("acme", job.id)
    assert (ended.state, ended.completed, ended.failed, ended.dropped) == ("cancelled", 1, 1, 3)
    assert states(store, job) == [DONE, FAILED] + [CANCELLED] * 3
    untouched = submit(store, 2, name="queued")  # nothing running: cancelled at once
    assert store.cancel("acme", untouched.id).state == "cancelled"
    assert store.cancel("acme", job.id).cancelling == ended.cancelling  # a second cancel: as is


def test_expire_deletes_only_jobs_finished_before_the_ttl_and_unread_files(store, url):
    """Finished jobs older than the TTL go with their items; an unfinished job, and the old
    input file it reads, stay; an old file nobody reads goes."""
    finished = submit(store, 2, name="finished")
    for item in store.claim(2):
        store.finish(item, ok())
    read = store.add_file("acme", "batch", "in.jsonl", b'{"x": 1}\n')
    unread = store.add_file("acme", "batch", "old.jsonl", b"{}\n")
    unfinished = submit(store, 3, name="unfinished", input_file_id=read.id)
    assert store.expire(3600) == 0  # all of it is younger than an hour
    assert store.job("acme", finished.id) is not None
    assert store.expire(3600, now=time.time() + 7200) == 1
    assert store.job("acme", finished.id) is None and store.results("acme", finished.id) is None
    assert store.job("acme", unfinished.id) is not None
    assert store.file("acme", read.id) == read
    assert store.file_content("acme", read.id) == b'{"x": 1}\n'
    assert store.file("acme", unread.id) is None
    with sqlite3.connect(url.removeprefix("sqlite:///")) as raw:  # the items went too
        assert raw.execute("SELECT COUNT(*) FROM items").fetchone() == (3,)


def test_another_tenants_ids_read_as_unknown(store):
    """Every call scoped to a tenant answers for another tenant's ids as for ids that never
    existed, and changes nothing."""
    job = submit(store, 2)
    f = store.add_file("acme", "batch", "in.jsonl", b"{}\n")
    assert store.job("globex", job.id) is None
    assert store.results("globex", job.id) is None
    assert store.cancel("globex", job.id) is None
    assert store.jobs("globex") == []
    assert store.file("globex", f.id) is None
    assert store.file_content("globex", f.id) is None
    assert store.delete_file("globex", f.id) is False
    assert store.job("acme", job.id).cancelling is None
    assert store.file("acme", f.id) == f
    assert [j.id for j in store.jobs("acme")] == [job.id]


def test_requeue_running_puts_back_only_unfinished_running_items(store):
    """What a dead feeder left running goes back to queued, in its place in the order; items
    with a result stay as they are."""
    job = submit(store, 5)
    a, b, c = store.claim(3)
    store.finish(b, ok(5))
    assert store.requeue_running().requeued == 2
    assert states(store, job) == [QUEUED, DONE, QUEUED, QUEUED, QUEUED]
    again = store.claim(10)
    assert [t.index for t in again] == [0, 2, 3, 4]
    # the same items, each on its second run
    assert again[0] == dataclasses.replace(a, attempt=2)
    assert again[1] == dataclasses.replace(c, attempt=2)
    assert store.requeue_running().requeued == 4
    assert store.results("acme", job.id)[1].result == ok(5)


def test_a_cancelled_jobs_running_items_are_dropped_not_rerun_after_a_crash(store):
    """Cancel keeps running items to finish; if their feeder dies instead, the restart drops
    them as the cancel dropped the queued ones, and the job ends cancelled."""
    job = submit(store, 4)
    first, _still_running = store.claim(2)
    store.finish(first, ok(1))
    store.cancel("acme", job.id)
    assert store.job("acme", job.id).state == "cancelling"
    assert store.requeue_running().requeued == 0
    assert states(store, job) == [DONE, CANCELLED, CANCELLED, CANCELLED]
    assert store.job("acme", job.id).state == "cancelled" and store.claim(5) == []


def test_an_item_that_has_run_its_attempts_fails_instead_of_running_again(store):
    """A request whose run takes the server down must not do so on every restart: after its
    max_attempts-th run it fails, with a 500 that says why, and its job can end."""
    job = submit(store, 2)
    for attempt in (1, 2):
        taken = store.claim(5)
        assert [(t.index, t.attempt) for t in taken] == [(0, attempt), (1, 1)][: 3 - attempt]
        if attempt == 1:
            store.finish(taken[1], ok(1))  # the other item ends; the first one "crashes"
        assert store.requeue_running(max_attempts=2) == ((1, 0) if attempt == 1 else (0, 1))
    record = store.results("acme", job.id)[0]
    assert (record.state, record.result.status, record.result.body) == (FAILED, 500, None)
    assert "has run 2 times, the last one as its server stopped" in record.result.error
    ended = store.job("acme", job.id)
    assert (ended.completed, ended.failed) == (1, 1) and ended.finished is not None
    assert store.pending("acme") == 0 and store.claim(5) == []


class _CommitFails:
    """A connection whose next COMMIT fails, as on a full disk; all else goes through."""

    def __init__(self, db):
        self._db, self.armed = db, True

    def execute(self, sql, *args):
        if sql == "COMMIT" and self.armed:
            self.armed = False
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_failed_commit_is_rolled_back_and_the_store_goes_on(store):
    real = store._db
    store._db = _CommitFails(real)
    with pytest.raises(BatchStoreError, match="database or disk is full"):
        submit(store, 2, name="lost")
    assert store.jobs("acme") == [] and not real.in_transaction
    kept = submit(store, 1)  # the next write begins and commits as usual
    assert [j.id for j in store.jobs("acme")] == [kept.id]
    store._db = real
