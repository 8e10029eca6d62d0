"""The processes grammar compiles run in: stopped when no one waits, shared fairly by tenants.

Each of `workers` threads owns a compile process (process.py) and runs one compile at a time
in it. A compile past the time limit, or one that no request waits for any more (each went
away or gave up), is stopped by killing its process, whose CPU is then free at once; a new
process takes its place before the thread's next compile. So no compile holds a worker past
the time limit, and what the schema check's cost estimate (cost.py) misses costs at most that.

Queued compiles wait in one queue per owner (a tenant), and the workers take from the
owners in turn, not in arrival order: an owner who sends many schemas waits behind its own,
and another's schema starts as soon as a worker frees. An owner runs at most `per_owner`
compiles at once, leaving the other workers to others, and queues at most `max_queued`;
past that its next schema is refused at once (OwnerBusy, its own doing: a 429).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)
POLL_S = 0.05  # how often a running compile looks whether it is still wanted
MAX_QUEUED = 8  # an owner's compiles waiting for a worker, at most
RESTART_S = 1.0  # the wait before retrying a process that failed to start
_LOCATION = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")  # xgrammar's "[time] file.cc:line: " prefix


class GrammarError(ValueError):
    """The response format cannot be compiled; the message names why, for its caller."""


class CompilerBusy(RuntimeError):
    """No worker was free for a compile: the engine's fault (a retry may succeed), not the schema's."""


class OwnerBusy(CompilerBusy):
    """The owner's own compiles fill its share of the workers and its queue: a retry once
    they end may succeed, but the wait is the owner's doing, not the engine's."""


@dataclass(eq=False)
class Job:
    """One compile: what it sends, its future, who waits for it, when it started."""

    schema: str
    strict: bool
    deadline: float  # the monotonic time after which no request waits for it any more
    owner: str | None = None  # who submitted it (a tenant); None: a server of one user
    kind: str = "json_schema"  # or "structural_tag": what schema holds
    future: Future = field(default_factory=Future)
    started: float | None = None  # when a worker began it; None while queued
    waiters: int = 1  # requests waiting on it; 0: stopped, or dropped from the queue

    def wanted(self, now: float) -> bool:
        return self.waiters > 0 and (self.started is not None or now < self.deadline)


class CompilePool:
    """submit(schema, strict, deadline, owner) -> a Job compiled in a worker process."""

    def __init__(
        self,
        start_process: Callable[[], object],
        read: Callable[[str], object],
        workers: int,
        time_limit_s: float,
        per_owner: int | None = None,
        max_queued: int = MAX_QUEUED,
    ):
        """start_process: a new CompileProcess; read: a compiled grammar from its text."""
        self._start_process, self._read = start_process, read
        self.workers, self.time_limit_s = workers, time_limit_s
        self.per_owner, self.max_queued = per_owner, max_queued
        self._queues: OrderedDict[str | None, deque[Job]] = OrderedDict()  # in turn order
        self._running: dict[int, Job] = {}  # worker -> its compile
        self._pids: dict[int, int] = {}  # worker -> its process's pid
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self) -> None:
        """Start the workers' processes (in their threads: seconds, off the caller's)."""
        with self._cond:
            if self._threads or self._closed:
                return
            for i in range(self.workers):
                thread = threading.Thread(target=self._work, args=(i,), daemon=True,
                                          name=f"grammar-compile-{i}")  # fmt: skip
                self._threads.append(thread)
                thread.start()

    def submit(
        self,
        schema: str,
        strict: bool,
        deadline: float,
        owner: str | None = None,
        kind: str = "json_schema",
    ) -> Job:
        """Queue a compile; CompilerBusy once shut down, OwnerBusy when owner's queue is full."""
        self.start()
        with self._cond:
            if self._closed:
                raise CompilerBusy("the engine shut down")
            queue = self._queues.setdefault(owner, deque())
            if len(queue) >= self.max_queued:
                raise OwnerBusy(self._owner_busy())
            job = Job(schema, strict, deadline, owner, kind)
            queue.append(job)
            self._cond.notify_all()
        return job

    def release(self, job: Job) -> None:
        """A request waiting on job went away: with none left, job stops (or never starts)."""
        with self._cond:
            job.waiters = max(job.waiters - 1, 0)

    def threads(self) -> int:
        """Compiles running now."""
        with self._cond:
            return len(self._running)

    def pids(self) -> list[int]:
        """The worker processes' ids, of those started."""
        with self._cond:
            return sorted(self._pids.values())

    def shutdown(self) -> None:
        """Fail every queued compile, stop the running ones and end the processes."""
        with self._cond:
            self._closed = True
            queued = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._cond.notify_all()
        _fail([(job, CompilerBusy("the engine shut down")) for job in queued])
        for thread in self._threads:
            thread.join(timeout=10)

    def _owner_busy(self) -> str:
        return (f"this tenant already has {self.max_queued} schemas waiting to compile; retry "
                f"when they end (each compile is stopped {self.time_limit_s:g} s after it "
                f"began, at most)")  # fmt: skip

    def _take(self, worker: int) -> Job | None:
        """The next compile for worker, owners in turn; None once shut down."""
        with self._cond:
            while not self._closed:
                now, dropped = time.monotonic(), []
                for queue in self._queues.values():  # what no one waits for never runs
                    dropped += [j for j in queue if not j.wanted(now)]
                    kept = [j for j in queue if j.wanted(now)]
                    queue.clear()
                    queue.extend(kept)
                job = self._next_job()
                if dropped or job is not None:
                    break
                self._cond.wait(POLL_S * 4)
            else:
                return None
            if job is not None:
                job.started = time.monotonic()
                self._running[worker] = job
        _fail([(j, CompilerBusy("no request waits for this compile any more")) for j in dropped])  # fmt: skip
        return job if job is not None else self._take(worker)

    def _next_job(self) -> Job | None:
        """The first queued job of the first owner in turn order under its share (called with
        the lock held); that owner goes to the back of the order."""
        busy = [job.owner for job in self._running.values()]
        for owner, queue in list(self._queues.items()):
            if not queue:
                del self._queues[owner]
                continue
            if self.per_owner is not None and owner is not None and busy.count(owner) >= self.per_owner:  # fmt: skip
                continue
            self._queues.move_to_end(owner)
            return queue.popleft()
        return None

    def _work(self, worker: int) -> None:
        process = None
        while not self._closed:
            if process is None:
                try:
                    process = self._start_process()
                except Exception:
                    logger.exception("starting a grammar compile process failed")
                    time.sleep(RESTART_S)
                    continue
                with self._cond:
                    self._pids[worker] = process.pid
            job = self._take(worker)
            if job is None:
                break
            try:
                outcome, stop = self._run(process, job)
            except Exception as exc:  # its process died, or answered what cannot be read
                logger.exception("a grammar compile process failed")
                outcome, stop = exc, True
            if stop:
                process.kill()
                process = None
                with self._cond:
                    self._pids.pop(worker, None)
            with self._cond:
                self._running.pop(worker, None)
                self._cond.notify_all()
            if isinstance(outcome, BaseException):
                _fail([(job, outcome)])
            else:
                job.future.set_result(outcome)
        if process is not None:
            process.kill()

    def _run(self, process, job: Job) -> tuple[object, bool]:
        """(job's grammar or why it failed, whether its process must be killed)."""
        process.compile(job.schema, job.strict, job.kind)
        limit = job.started + self.time_limit_s
        while True:
            reply = process.reply(min(POLL_S, limit - time.monotonic()))
            if reply is not None:
                if "error" in reply:
                    why = _LOCATION.sub("", reply["error"])
                    return GrammarError(f"the schema cannot be compiled: {why}"), False
                return self._read(reply["ok"]), False
            if time.monotonic() >= limit:
                return GrammarError(f"the response format's schema did not compile within "
                                    f"{self.time_limit_s:g} s; simplify it"), True  # fmt: skip
            if self._closed:
                return CompilerBusy("the engine shut down"), True
            if not job.waiters:
                return CompilerBusy("no request waits for this compile any more"), True


def _fail(failed: list[tuple[Job, BaseException]]) -> None:
    """Fail jobs (outside the pool's lock: their callbacks may take others)."""
    for job, exc in failed:
        job.future.set_exception(exc)
