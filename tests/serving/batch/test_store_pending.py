"""A tenant's batch backlog in the store: what counts as pending, the limit a submit is held
to (counted in the transaction that inserts), and tenants kept apart."""

import random
import threading

import pytest

from serving.batch.records import QUEUED, RUNNING, ItemResult
from serving.batch.store import BatchQueueFull, BatchStore
from tests.serving.batch.test_store import ok, submit


def test_queued_and_running_count_and_ended_items_do_not(store):
    first = submit(store, 4)
    submit(store, 2, tenant="globex")
    assert store.pending("acme") == 4 and store.pending("globex") == 2
    taken = store.claim(3)  # running now: still pending
    assert store.pending("acme") + store.pending("globex") == 6
    acme = [item for item in taken if item.tenant == "acme"]
    store.finish(acme[0], ok())
    assert store.pending("acme") == 3
    store.cancel("acme", first.id)  # its queued items end; the running one runs on
    running = sum(item.tenant == "acme" for item in taken) - 1
    assert store.pending("acme") == running
    assert store.pending("initech") == 0


def test_a_submit_past_the_limit_stores_nothing_and_says_why(store):
    submit(store, 3, max_pending=5)
    with pytest.raises(BatchQueueFull) as exc:
        submit(store, 3, max_pending=5)
    assert "has 3 batch request(s) queued or running and may have at most 5" in str(exc.value)
    assert len(store.jobs("acme")) == 1 and store.pending("acme") == 3
    submit(store, 2, max_pending=5)  # exactly up to the limit
    submit(store, 7, tenant="globex", max_pending=5 + 2)  # another tenant's own count
    assert store.pending("acme") == 5


def test_a_batch_larger_than_the_limit_is_refused_on_its_own(store):
    with pytest.raises(BatchQueueFull, match="a batch of 4 requests is more than this tenant's"):
        submit(store, 4, max_pending=3)
    assert store.jobs("acme") == []


def test_ended_items_make_room(store):
    submit(store, 2, max_pending=2)
    for item in store.claim(2):
        store.finish(item, ok())
    submit(store, 2, max_pending=2)


def test_concurrent_submits_from_two_connections_cannot_pass_it_together(store, url):
    """Each submit counts and inserts in one IMMEDIATE transaction: of 12 racing submits of
    one request each, from two connections, exactly the limit's worth get in."""
    other = BatchStore(url)
    accepted, refused = [], []

    def one(s, i):
        try:
            accepted.append(submit(s, 1, name=f"r{i}", max_pending=5))
        except BatchQueueFull:
            refused.append(i)

    threads = [threading.Thread(target=one, args=((store, other)[i % 2], i)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert len(accepted) == 5 and len(refused) == 7
    assert store.pending("acme") == 5


def test_a_cancelled_jobs_item_released_after_a_transient_failure_does_not_run_again(store):
    job = submit(store, 2)
    [item] = store.claim(1)
    store.cancel("acme", job.id)  # the running item runs on; the queued one is dropped
    store.release(item)  # its run failed transiently: it would be retried, but not now
    assert store.claim(5) == []
    assert store.pending("acme") == 0
    ended = store.job("acme", job.id)
    assert ended.finished is not None and ended.completed == ended.failed == 0


def test_the_count_equals_the_items_states_through_random_runs(store):
    """Reference: each item's own state, read back through results(). Jobs end, are cancelled
    mid-run, fail, are released and requeued in random order, for three tenants."""
    rng = random.Random(7)
    tenants, jobs, running = ("acme", "globex", "initech"), [], []
    for _ in range(300):
        action = rng.choice(("submit", "claim", "claim", "finish", "finish", "release", "cancel"))
        if action == "submit":
            tenant = rng.choice(tenants)
            jobs.append((tenant, submit(store, rng.randint(1, 6), tenant=tenant)))
        elif action == "claim":
            running += store.claim(rng.randint(1, 4))
        elif action in ("finish", "release") and running:
            item = running.pop(rng.randrange(len(running)))
            if action == "release":
                store.release(item)
            else:
                store.finish(item, ok() if rng.random() < 0.7 else ItemResult(400, error="bad"))
        elif action == "cancel" and jobs:
            tenant, job = rng.choice(jobs)
            asker = tenant if rng.random() < 0.8 else rng.choice(tenants)  # others: no effect
            store.cancel(asker, job.id)
        if rng.random() < 0.02:
            store.requeue_running()
            running = []
        for tenant in tenants:
            states = [r.state for t, job in jobs if t == tenant for r in store.results(t, job.id)]
            assert store.pending(tenant) == sum(s in (QUEUED, RUNNING) for s in states)
