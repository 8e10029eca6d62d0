"""The feeder: takes queued items from the batch store and runs them, a bounded number at once.

It keeps at most max_in_flight items running, so the store, not the engine's queue, holds the
backlog, and the items it runs (at the scheduler's batch priority, which is the runner's to
set) only use capacity interactive requests leave. Each result is committed to the store as
its item ends. A failure the item is not to blame for (a full queue, a lost replica, a runner
that raises) puts it back in the queue, up to MAX_ATTEMPTS runs; any other failure is that
item's result alone. On start it puts back the items a dead process left running (failing
one that has run MAX_RUNS times), and every sweep_s it ends the OpenAI jobs whose completion
window (24 h) has passed, their queued items expired, and deletes what has outlived
batch.ttl_hours. Committed results are then handed to on_result (usage metering), after the
commit, so a crash between the two loses a usage record rather than counting one twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool

from serving.batch.records import COMPLETION_WINDOW_S, Item, ItemResult
from serving.batch.store import BatchStore

log = logging.getLogger("loraserve.batch")
Runner = Callable[[Item], Awaitable[ItemResult]]
ResultHook = Callable[[Item, ItemResult], Awaitable[None]]
IDLE_POLL_S = 0.5  # how often an idle feeder looks for work that no wake() announced
SWEEP_S = 600.0
MAX_ATTEMPTS = 3  # runs of an item that fails transiently before its failure is its result
# Runs of an item after which a server stopping during it fails it rather than requeueing
# it: a request that takes its server down cannot do so forever. Items that only happened
# to be running at a restart (its head-of-queue neighbours) rarely meet that many stops.
MAX_RUNS = 10
RETRY_AFTER_S = 1.0  # a transiently failed item holds its slot this long before its rerun
STORE_RETRY_S = (0.5, 1, 2, 5, 10)  # waits between tries to commit a result; then every 10 s


class Feeder:
    """Runs the store's queued items through run(item), at most max_in_flight at once."""

    def __init__(
        self, store: BatchStore, run: Runner, *, max_in_flight: int, ttl_s: float,
        on_result: ResultHook | None = None, sweep_s: float = SWEEP_S,
        window_s: float = COMPLETION_WINDOW_S,
    ) -> None:  # fmt: skip
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.store, self.run, self.on_result = store, run, on_result
        self.max_in_flight, self.ttl_s, self.sweep_s = max_in_flight, ttl_s, sweep_s
        self.window_s = window_s
        self.running: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Requeue what a dead feeder left running, then feed on this event loop."""
        requeued, failed = self.store.requeue_running(max_attempts=MAX_RUNS)
        if requeued:
            log.warning("%d batch items were left running by a stopped server; rerunning", requeued)
        if failed:
            log.error("%d batch items had run %d times when a server stopped; they fail "
                      "instead of running again", failed, MAX_RUNS)  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._feed(), name="batch-feeder")

    def wake(self) -> None:
        """Look for work now (a job was submitted)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop feeding and cancel running items; they stay running in the store and run
        again when a feeder next starts."""
        tasks = [t for t in (self._task, *self.running) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _feed(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        while True:
            # Cleared before the claim: a wake() during it (a submit) is then not lost.
            self._wake.clear()
            try:
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.sweep_s
                    await self._sweep()
                room = self.max_in_flight - len(self.running)
                items = await run_in_threadpool(self.store.claim, room) if room else []
            except Exception as exc:  # the store is unreachable for now; keep trying
                log.error("the batch feeder cannot read its store: %s", exc)
                items = []
            for item in items:
                task = loop.create_task(self._one(item))
                self.running.add(task)
                task.add_done_callback(self._done)
            if not items:
                # Not wait_for: before Python 3.12 it swallows a cancel (stop()) that arrives
                # as the event is set (a running item ending), and feeding would never stop.
                waiting = loop.create_task(self._wake.wait())
                try:
                    await asyncio.wait((waiting,), timeout=IDLE_POLL_S)
                finally:
                    waiting.cancel()

    async def _sweep(self) -> None:
        expired = await run_in_threadpool(self.store.close_overdue, self.window_s)
        if expired:
            log.warning("%d batches passed their completion window; their requests not yet "
                        "run expired", expired)  # fmt: skip
        await run_in_threadpool(self.store.expire, self.ttl_s)

    async def _store(self, call, *args):
        """call(*args) on the store, retried until it succeeds (a busy or full disk must
        not leave the item running until a restart) or the feeder stops."""
        for attempt in itertools.count():
            try:
                return await run_in_threadpool(call, *args)
            except Exception as exc:
                wait = STORE_RETRY_S[min(attempt, len(STORE_RETRY_S) - 1)]
                log.error("batch store: %s failed (%s); retrying in %g s", call.__name__, exc, wait)
                await asyncio.sleep(wait)

    def _done(self, task: asyncio.Task) -> None:
        self.running.discard(task)
        self._wake.set()  # room for another item

    async def _one(self, item: Item) -> None:
        try:
            result = await self.run(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the runner's own failure (a replica that died): transient
            log.warning("batch item %s#%d could not be run: %s: %s",
                        item.job_id, item.index, type(exc).__name__, exc)  # fmt: skip
            result = ItemResult(500, error=f"the item could not be run ({type(exc).__name__})")
        if result.transient and item.attempt < MAX_ATTEMPTS:
            await asyncio.sleep(RETRY_AFTER_S)  # holding the slot: a busy server gets a pause
            await self._store(self.store.release, item)
            return
        recorded = await self._store(self.store.finish, item, result)
        if recorded and self.on_result is not None:
            try:
                await self.on_result(item, result)
            except Exception as exc:
                log.error("usage of batch item %s#%d was not recorded: %s",
                          item.job_id, item.index, exc)  # fmt: skip
