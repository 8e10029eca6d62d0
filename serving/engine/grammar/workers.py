"""The threads grammar compiles run on, so that no compile waits long on another's.

xgrammar cannot stop a compile once it has begun: one past the time limit has already failed
its requests, yet keeps its thread until xgrammar returns (a minute or more for a pathological
schema). A fixed pool would let a few such compiles hold every worker, and every later schema
would queue behind them. So only a compile's first `slow_s` seconds count against the
workers (most compile in milliseconds): a queued compile starts on a thread of its own beside
slower ones, up to a bound on threads in all. When every one of those threads is held by a
compile past its time limit, nothing a new compile could wait for is due, so it is refused at
once (CompilerBusy) rather than queued. And so that one tenant's slow schemas cannot take
every thread from the others, a tenant runs at most `per_owner` compiles at once; while that
many of its compiles are past their first `slow_s` seconds, its next is refused at once
(OwnerBusy, its own doing) instead of waiting for them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field


class CompilerBusy(RuntimeError):
    """No thread is free for a compile: the engine's fault (a retry may succeed), not the schema's."""


class OwnerBusy(CompilerBusy):
    """The owner's own slow compiles hold its share of the threads: a retry once they end
    may succeed, but the wait is the owner's doing, not the engine's."""


@dataclass(eq=False)
class Job:
    """One compile: its future, the latest deadline of a request waiting on it, its start."""

    fn: Callable[[], object]
    deadline: float  # the monotonic time after which no request waits for it any more
    owner: str | None = None  # who submitted it (a tenant); None: not bounded per owner
    future: Future = field(default_factory=Future)
    started: float | None = None  # when its thread began it; None while queued


class CompilePool:
    """submit(fn, deadline) -> a Job run on a thread: at most `workers` compiles in their
    first slow_s seconds at once, at most `max_threads` (runaway ones too) in all, and at
    most `per_owner` of one owner's at once (None: no such bound)."""

    def __init__(
        self,
        workers: int,
        max_threads: int,
        time_limit_s: float,
        slow_s: float,
        per_owner: int | None = None,
    ):
        self.workers, self.max_threads, self.per_owner = workers, max_threads, per_owner
        self.time_limit_s, self.slow_s = time_limit_s, slow_s
        self._queue: deque[Job] = deque()
        self._running: set[Job] = set()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None  # wakes the queue (see _dispatch)
        self._timer_due = 0.0  # when it fires (monotonic)
        self._closed = False

    def submit(self, fn: Callable[[], object], deadline: float, owner: str | None = None) -> Job:
        """Queue fn, to start as soon as a thread is free; CompilerBusy when none can be,
        OwnerBusy when owner's share is held by its own slow compiles."""
        with self._lock:
            now = time.monotonic()
            if self._stuck(now):
                raise CompilerBusy(self._busy())
            if self._owner_slow(owner, now):
                raise OwnerBusy(self._owner_busy())
            job = Job(fn, deadline, owner)
            self._queue.append(job)
            dropped = self._dispatch()
        _fail(dropped)
        return job

    def threads(self) -> int:
        """Compiles running now, within their limit or past it."""
        with self._lock:
            return len(self._running)

    def shutdown(self) -> None:
        """Fail every queued compile; running ones end when xgrammar returns (daemon threads)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            queued, self._queue = list(self._queue), deque()
        _fail([(job, CompilerBusy("the engine shut down")) for job in queued])

    def _stuck(self, now: float) -> bool:
        """Every thread is held by a compile past its time limit."""
        overrun = sum(now - job.started >= self.time_limit_s for job in self._running)
        return overrun >= self.max_threads

    def _busy(self) -> str:
        return (f"the schema compiler is busy: all {self.max_threads} of its threads are "
                f"still compiling earlier schemas that overran the {self.time_limit_s:g} s "
                f"time limit; retry later")  # fmt: skip

    def _owned(self, owner: str | None) -> list[Job]:
        """owner's running compiles, when owners are bounded and it is one."""
        if self.per_owner is None or owner is None:
            return []
        return [job for job in self._running if job.owner == owner]

    def _owner_slow(self, owner: str | None, now: float) -> bool:
        """owner's share is held by compiles of its own past their first slow_s seconds."""
        slow = sum(now - job.started >= self.slow_s for job in self._owned(owner))
        return self.per_owner is not None and slow >= self.per_owner

    def _owner_busy(self) -> str:
        return (f"{self.per_owner} of this tenant's earlier schemas are still compiling, "
                f"past {self.slow_s:g} s each; retry when they end (at most "
                f"{self.time_limit_s:g} s after they began, or simplify them)")  # fmt: skip

    def _fresh(self, now: float) -> list[float]:
        """When each compile still in its first slow_s seconds started."""
        return [job.started for job in self._running if now - job.started < self.slow_s]

    def _dispatch(self) -> list[tuple[Job, CompilerBusy]]:
        """Start queued jobs while the bounds allow (called with the lock held); returns the
        queued jobs dropped and why, for the caller to fail once it lets go of the lock."""
        if self._closed:
            return []
        now = time.monotonic()
        # Every request that waited on a job past its deadline has failed already: no thread
        # is spent on it.
        dropped = [(job, CompilerBusy("no request waits for this compile any more"))
                   for job in self._queue if job.deadline <= now]  # fmt: skip
        self._queue = deque(job for job in self._queue if job.deadline > now)
        if self._stuck(now):  # nothing the queue waits for is due: refuse it now
            dropped += [(job, CompilerBusy(self._busy())) for job in self._queue]
            self._queue = deque()
        # Nor is anything a job waits for due when its owner's share has turned slow.
        slow = {owner for owner in {job.owner for job in self._queue}
                if self._owner_slow(owner, now)}  # fmt: skip
        dropped += [
            (job, OwnerBusy(self._owner_busy())) for job in self._queue if job.owner in slow
        ]
        self._queue = deque(job for job in self._queue if job.owner not in slow)
        waiting = deque()  # jobs whose owner runs its share now: they keep their place
        while self._queue and len(self._running) < self.max_threads:
            if len(self._fresh(now)) >= self.workers:
                break
            job = self._queue.popleft()
            if self.per_owner is not None and len(self._owned(job.owner)) >= self.per_owner:
                waiting.append(job)
                continue
            job.started = now
            self._running.add(job)
            threading.Thread(target=self._run, args=(job,), name="grammar-compile", daemon=True).start()  # fmt: skip
        self._queue.extendleft(reversed(waiting))
        if self._queue:
            # Look again when the first running compile turns slow (a free worker) or runs
            # past its limit (queued compiles are then refused); one that ends dispatches.
            limit, slow = self.time_limit_s, self.slow_s
            turns = [start + slow for start in self._fresh(now)] or [
                j.started + limit for j in self._running if now - j.started < limit
            ]
            due = max(min(turns, default=now), now)
            if self._timer is not None and due < self._timer_due:  # a sooner turn came
                self._timer.cancel()
                self._timer = None
            if self._timer is None:
                self._timer_due = due
                self._timer = threading.Timer(due - now + 0.001, self._wake)
                self._timer.daemon = True
                self._timer.start()
        return dropped

    def _wake(self) -> None:
        with self._lock:
            self._timer = None
            dropped = self._dispatch()
        _fail(dropped)

    def _run(self, job: Job) -> None:
        try:
            result = job.fn()
        except BaseException as exc:  # handed to whoever waits on the future
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
        finally:
            with self._lock:
                self._running.discard(job)
                dropped = self._dispatch()
            _fail(dropped)


def _fail(dropped: list[tuple[Job, CompilerBusy]]) -> None:
    """Fail jobs that never ran (outside the pool's lock: their callbacks may take others)."""
    for job, exc in dropped:
        job.future.set_exception(exc)
