"""A batch feeder in a process of its own that SIGKILLs itself at a chosen point, for
test_crash.py. It runs one job of a store file to its end unless it dies first:

    python -m tests.serving.batch.crash_server DB JOB_ID LOGS_DIR KILL N

KILL is where it dies, N counting the occurrences of that point in this process:
  claim         right after the N-th claim that took items has committed
  mid-commit    in the N-th finish(), its UPDATEs done, as its COMMIT begins (not committed)
  after-commit  right after the N-th finish() has committed, before on_result and the next claim
  none          never (the parent may still kill it: it prints "ready" once feeding)

The runner's answer is a function of the item alone (result_for), so every run of an item
gives the same result. LOGS_DIR gets, each through an O_APPEND descriptor whose writes a
SIGKILL cannot lose: runs.log (an index each time the runner starts an item), metered.log
(an index each time on_result meters one) and kills.log (the kill point and the items it
hit, written just before dying).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path

from serving.batch.feeder import Feeder
from serving.batch.records import Item, ItemResult
from serving.batch.store import BatchStore

TENANT = "acme"
MAX_IN_FLIGHT = 4
RUN_S = 0.01  # per item: several run at once, and a whole job takes at least 0.5 s


def result_for(index: int, body: dict) -> ItemResult:
    """The result every run of item `index` gives: its prompt upper-cased, or a failure of its
    own (not retried). The prompt token count is unique per item, so a job's total shows a
    result counted twice."""
    if body.get("fail"):
        return ItemResult(400, error="this item always fails")
    return ItemResult(200, {"response": body["prompt"].upper()}, None, index + 1, 2)


class Log:
    """Lines appended with single write(2) calls: in the kernel once written, whatever kills us."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, *words: object) -> None:
        os.write(self.fd, (" ".join(map(str, words)) + "\n").encode())


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(store: BatchStore, kill: str, n: int, kills: Log) -> None:
    """Make this process die at the kill point, by wrapping this store's methods (the Feeder
    calls them through the instance) or tracing its connection's statements."""
    count = [0]
    if kill == "claim":
        claim = store.claim

        def claim_then_die(k: int) -> list[Item]:
            items = claim(k)
            if items:
                count[0] += 1
                if count[0] == n:
                    kills.line("claim", *(item.index for item in items))
                    die()
            return items

        store.claim = claim_then_die
    elif kill in ("mid-commit", "after-commit"):
        finish, here = store.finish, threading.local()  # finish runs in a worker thread

        def finish_then_die(item: Item, result: ItemResult) -> bool:
            count[0] += 1
            here.item, here.updates = (item if count[0] == n else None), []
            recorded = finish(item, result)
            if kill == "after-commit" and here.item is not None:
                kills.line("after-commit", item.index, recorded)
                die()
            return recorded

        def trace(sql: str) -> None:  # runs as each statement begins, in finish's thread
            item = getattr(here, "item", None)
            if item is None:
                return
            if sql.startswith(("UPDATE items SET state", "UPDATE jobs SET")):
                here.updates.append(sql.split(" SET ")[0])
            elif sql == "COMMIT":
                kills.line("mid-commit", item.index, len(here.updates))
                die()

        store.finish = finish_then_die
        if kill == "mid-commit":
            store._db.set_trace_callback(trace)
    elif kill != "none":
        raise SystemExit(f"unknown kill point {kill!r}")


async def feed(db: str, job_id: str, logs: Path, kill: str, n: int) -> None:
    store = BatchStore(f"sqlite:///{db}")
    runs, metered = Log(logs / "runs.log"), Log(logs / "metered.log")
    arm(store, kill, n, Log(logs / "kills.log"))

    async def run(item: Item) -> ItemResult:
        runs.line(item.index)
        await asyncio.sleep(RUN_S)
        return result_for(item.index, item.body)

    async def meter(item: Item, result: ItemResult) -> None:
        metered.line(item.index)

    feeder = Feeder(store, run, max_in_flight=MAX_IN_FLIGHT, ttl_s=1e9, on_result=meter)
    feeder.start()
    print("ready", flush=True)
    while store.job(TENANT, job_id).finished is None:
        await asyncio.sleep(0.02)
    await feeder.stop()
    store.close()


if __name__ == "__main__":
    db, job_id, logs, kill, n = sys.argv[1:]
    asyncio.run(feed(db, job_id, Path(logs), kill, int(n)))
