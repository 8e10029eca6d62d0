"""The feeder over a real store file with stand-in runners: how many items it runs at once, a
runner that raises, a stop and a restart, and results metered once each."""

import asyncio
from collections import Counter

import pytest

from serving.batch import feeder as feeder_module
from serving.batch.feeder import MAX_ATTEMPTS, Feeder
from serving.batch.records import (
    DONE,
    EXPIRED,
    FAILED,
    OPENAI,
    QUEUED,
    RUNNING,
    WORKERS_AI,
    ItemResult,
    NewItem,
)
from serving.batch.store import BatchStore

TTL_S = 3600.0


@pytest.fixture
def store(tmp_path):
    s = BatchStore(f"sqlite:///{tmp_path / 'batch.db'}")
    yield s
    s.close()


def submit(store, prompts):
    items = [NewItem({"prompt": p}) for p in prompts]
    return store.submit(tenant="acme", key_id="k", model="demo", api=WORKERS_AI,
                        endpoint="/ai/run", items=items)  # fmt: skip


def answer(item):
    return ItemResult(200, {"response": item.body["prompt"].upper()}, None, 1, item.index + 1)


async def until(check, timeout=20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def finished(store, job):
    return lambda: store.job("acme", job.id).finished is not None


def feed_to_the_end(store, job, run, done=None, **options):
    """Run a Feeder over store until job has finished (or done() holds), then stop it."""

    async def main():
        feeder = Feeder(store, run, ttl_s=TTL_S, **options)
        feeder.start()
        await until(done or finished(store, job))
        await feeder.stop()

    asyncio.run(main())


def test_never_more_than_max_in_flight_items_run_at_once(store):
    """The runner never sees more than max_in_flight calls at once, nor the store more items
    running; and the feeder does fill its room (the peak is reached)."""
    job = submit(store, [f"p{i}" for i in range(30)])
    now, peak, stored_peak = [0], [0], [0]

    async def run(item):
        now[0] += 1
        peak[0] = max(peak[0], now[0])
        running = sum(r.state == RUNNING for r in store.results("acme", job.id))
        stored_peak[0] = max(stored_peak[0], running)
        await asyncio.sleep(0.01)
        now[0] -= 1
        return answer(item)

    feed_to_the_end(store, job, run, max_in_flight=3)
    assert peak[0] == 3 and stored_peak[0] == 3
    done = store.job("acme", job.id)
    assert (done.completed, done.failed, done.completion_tokens) == (30, 0, sum(range(1, 31)))


def test_a_runner_that_raises_fails_its_item_alone_after_its_retries(store, monkeypatch):
    """A runner that raises is taken as transient: the item runs again, MAX_ATTEMPTS times in
    all, then fails alone with the exception's type; the other items are untouched."""
    monkeypatch.setattr(feeder_module, "RETRY_AFTER_S", 0.0)
    prompts = ["a", "boom", "c", "d", "boom", "f"]
    job = submit(store, prompts)
    runs = Counter()

    async def run(item):
        runs[item.index] += 1
        await asyncio.sleep(0)
        if item.body["prompt"] == "boom":
            raise ValueError("the runner broke")
        return answer(item)

    feed_to_the_end(store, job, run, max_in_flight=2)
    records = store.results("acme", job.id)
    assert [r.state for r in records] == [DONE, FAILED, DONE, DONE, FAILED, DONE]
    for r in records:
        if r.state == FAILED:  # the exception's type only: its text may hold anything
            assert r.result == ItemResult(500, error="the item could not be run (ValueError)")
        else:
            assert r.result.body == {"response": prompts[r.index].upper()}
    job = store.job("acme", job.id)
    assert (job.completed, job.failed, job.state) == (4, 2, "done")
    assert runs == {0: 1, 1: MAX_ATTEMPTS, 2: 1, 3: 1, 4: MAX_ATTEMPTS, 5: 1}


def test_items_running_at_stop_stay_running_and_the_next_feeder_finishes_them(store, tmp_path):
    """stop() commits nothing for the items it interrupts; a feeder started later (here on a
    fresh connection, as after a restart) requeues them and runs each to one result."""
    job = submit(store, [f"p{i}" for i in range(6)])
    started = []

    async def hang(item):
        started.append(item.index)
        await asyncio.Event().wait()

    async def first():
        feeder = Feeder(store, hang, max_in_flight=2, ttl_s=TTL_S)
        feeder.start()
        await until(lambda: len(started) == 2)
        await feeder.stop()

    asyncio.run(first())
    assert started == [0, 1]
    assert [r.state for r in store.results("acme", job.id)] == [RUNNING] * 2 + [QUEUED] * 4
    reopened = BatchStore(f"sqlite:///{tmp_path / 'batch.db'}")
    ran = []

    async def run(item):
        ran.append(item.index)
        return answer(item)

    async def second():
        feeder = Feeder(reopened, run, max_in_flight=2, ttl_s=TTL_S)
        feeder.start()
        await until(finished(reopened, job))
        await feeder.stop()

    asyncio.run(second())
    assert sorted(ran) == list(range(6))
    records = reopened.results("acme", job.id)
    assert [r.result.body["response"] for r in records] == [f"P{i}" for i in range(6)]
    assert reopened.job("acme", job.id).completed == 6
    reopened.close()


def test_each_committed_result_is_metered_once_after_its_commit(store):
    """An item run twice (its first runner outlived a restart's requeue) is committed by the
    run that finishes first; only that run is metered, and on_result sees it committed."""
    job = submit(store, [f"p{i}" for i in range(5)])
    gate, metered, committed_when_metered = asyncio.Event(), [], []

    async def slow(item):
        await gate.wait()
        return ItemResult(200, {"response": "stale"})

    async def fast(item):
        return answer(item)

    async def meter(item, result):
        metered.append((item.index, result.body["response"]))
        committed_when_metered.append(store.results("acme", job.id)[item.index].state)

    async def main():
        old = Feeder(store, slow, max_in_flight=5, ttl_s=TTL_S, on_result=meter)
        old.start()
        await until(lambda: store.queued() == 0)  # the old feeder holds every item
        new = Feeder(store, fast, max_in_flight=5, ttl_s=TTL_S, on_result=meter)
        new.start()  # requeues them, as a restarted server does
        await until(finished(store, job))
        gate.set()  # the old runs end now; their results must not land
        await until(lambda: not old.running)
        await old.stop()
        await new.stop()

    asyncio.run(main())
    assert sorted(metered) == [(i, f"P{i}") for i in range(5)]
    assert committed_when_metered == [DONE] * 5
    records = store.results("acme", job.id)
    assert [r.result.body["response"] for r in records] == [f"P{i}" for i in range(5)]
    assert store.job("acme", job.id).completed == 5


def test_stop_ends_the_feeder_when_a_wake_lands_with_the_cancel(store):
    """An idle feeder woken just as it is stopped (an item ending as the server shuts down)
    still stops: the wake must not swallow stop()'s cancel."""

    async def main():
        feeder = Feeder(store, lambda item: None, max_in_flight=1, ttl_s=TTL_S)
        feeder.start()
        await asyncio.sleep(0.05)  # nothing queued: it waits for a wake
        feeder.wake()
        stopping = asyncio.ensure_future(feeder.stop())
        # Not wait_for: its cancel on timeout would reach the feeder and end it after all.
        done, _ = await asyncio.wait({stopping}, timeout=5)
        assert stopping in done, "stop() did not return"
        assert feeder._task.cancelled()

    asyncio.run(main())


def test_a_busy_server_puts_the_item_back_rather_than_failing_it(store, monkeypatch):
    """A 429 or 503 (the server's queue full, a store unreachable) is no result: the item
    goes back to the queue and its next run's answer is the one committed and metered."""
    monkeypatch.setattr(feeder_module, "RETRY_AFTER_S", 0.0)
    job = submit(store, ["a", "b"])
    runs, metered = Counter(), []

    async def run(item):
        runs[item.index] += 1
        if item.index == 1 and runs[1] < MAX_ATTEMPTS:
            return ItemResult(429 if runs[1] == 1 else 503, error="busy")
        return answer(item)

    async def meter(item, result):
        metered.append((item.index, result.status))

    # until both are metered: the last is metered just after the commit that ends the job
    feed_to_the_end(store, job, run, lambda: len(metered) == 2, max_in_flight=2, on_result=meter)
    assert [r.state for r in store.results("acme", job.id)] == [DONE, DONE]
    assert runs == {0: 1, 1: MAX_ATTEMPTS} and sorted(metered) == [(0, 200), (1, 200)]


def test_a_job_past_its_completion_window_expires_before_any_item_runs(store):
    """The feeder's sweep (on start, then every sweep_s) ends OpenAI jobs older than the
    window: their items expire without running; a job of another API still runs."""
    overdue = store.submit(tenant="acme", key_id="k", model="demo", api=OPENAI,
                           endpoint="/v1/completions", items=[NewItem({"prompt": "a"})] * 3)  # fmt: skip
    workers = submit(store, ["b"])
    ran = []

    async def run(item):
        ran.append(item.job_id)
        return answer(item)

    feed_to_the_end(store, workers, run, max_in_flight=2, window_s=0.0)
    assert ran == [workers.id]
    assert store.job("acme", overdue.id).state == "expired"
    assert [r.state for r in store.results("acme", overdue.id)] == [EXPIRED] * 3
