"""serving.usage.store: several writers on one file, threads and processes, lose nothing."""

import multiprocessing
import threading

from serving.usage.record import UsageRecord
from serving.usage.store import UsageStore

WRITES = 200
T0 = 1_700_000_000.0


def _record(writer: int, i: int) -> UsageRecord:
    # Writers share minutes and keys, so their upserts hit the same rows.
    return UsageRecord(
        tenant="acme",
        key_id=f"k{i % 3}",
        adapter="base",
        kind="batch" if i % 4 == 0 else "interactive",
        prompt_tokens=writer + 1,
        cached_tokens=i % 2,
        completion_tokens=i,
        time=T0 + i % 90,
    )


def _write(url: str, writer: int, start=None) -> None:
    """One writer: its own UsageStore on the shared file, one transaction per request."""
    store = UsageStore(url)
    if start is not None:
        start.wait()  # every writer open before any writes: their transactions overlap
    for i in range(WRITES):
        store.record([_record(writer, i)])
    store.close()


def _expected_totals(writers: int) -> dict:
    totals = {
        k: dict.fromkeys(("requests", "prompt_tokens", "cached_tokens", "completion_tokens"), 0)
        for k in ("interactive", "batch")
    }
    for writer in range(writers):
        for i in range(WRITES):
            r = _record(writer, i)
            counts = totals[r.kind]
            counts["requests"] += 1
            counts["prompt_tokens"] += r.prompt_tokens
            counts["cached_tokens"] += r.cached_tokens
            counts["completion_tokens"] += r.completion_tokens
    return totals


def test_two_stores_on_one_file_written_from_threads_lose_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/usage.db"
    start = threading.Barrier(2)
    threads = [threading.Thread(target=_write, args=(url, w, start)) for w in range(2)]
    shared = UsageStore(url)  # and a third writer: one store shared by two threads
    threads += [
        threading.Thread(target=lambda w=w: [shared.record([_record(w, i)]) for i in range(WRITES)])
        for w in (2, 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shared.totals() == _expected_totals(4)
    shared.close()


def test_stores_in_several_processes_lose_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/usage.db"
    UsageStore(url).close()  # the schema exists before the race, as after a first start
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(3)
    processes = [ctx.Process(target=_write, args=(url, w, start)) for w in range(3)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    store = UsageStore(url)
    assert store.totals() == _expected_totals(3)
    assert store.query(group_by="key", tenant="acme")[0]["key_id"] == "k0"
    store.close()


def test_processes_creating_the_schema_at_once_all_succeed(tmp_path):
    url = f"sqlite:///{tmp_path}/fresh/usage.db"
    ctx = multiprocessing.get_context("spawn")
    processes = [ctx.Process(target=_write, args=(url, w)) for w in range(3)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    store = UsageStore(url)
    assert store.totals() == _expected_totals(3)
    store.close()
