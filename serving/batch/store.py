"""The batch store in SQLite (WAL): jobs, their items and results, and uploaded files.

A job is acknowledged only after the transaction that holds all its items has committed, so
an answered submit survives any crash. Items move queued -> running -> done | failed; the
move to done or failed writes the result and the job's counts in one transaction, and only
from running, so each item's result is committed exactly once however often it runs. One
feeder owns the running items: when it starts, items left running by a process that died
go back to queued and run again (requeue_running), up to the feeder's MAX_RUNS runs in
all. synchronous=FULL makes a commit durable even across a power loss, not only a killed
process.

A BatchStore is safe to share between threads (one connection under a lock).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from serving.batch.files import FileTable, file_totals, new_id
from serving.batch.queue import ItemQueue, close_if_ended
from serving.batch.records import (
    CANCELLED,
    QUEUED,
    RUNNING,
    BatchHoldings,
    Job,
    NewItem,
)
from serving.batch.results import ResultPages, job_seq
from serving.batch.schema import JOB_COLUMNS, create_or_upgrade
from serving.batch.space import disk_full, shortfall
from serving.private_sqlite import connect_private

BUSY_TIMEOUT_MS = 30_000


class BatchStoreError(RuntimeError):
    """A batch database that cannot be opened or used; the message names its path."""


class StoreFull(BatchStoreError):
    """A write refused, or failed, because the store's disk is (nearly) full."""


class BatchQueueFull(ValueError):
    """A submit that would take its tenant past its limit of batch requests not yet ended."""

    def __init__(self, pending: int, limit: int, asked: int) -> None:
        self.pending, self.limit, self.asked = pending, limit, asked
        if asked > limit:
            reason = f"a batch of {asked} requests is more than this tenant's limit of {limit}"
        else:
            reason = (f"this tenant has {pending} batch request(s) queued or running and may "
                      f"have at most {limit}; {asked} more would pass it")  # fmt: skip
        super().__init__(reason)


class BatchStore(FileTable, ItemQueue, ResultPages):
    """Jobs, items and files in one SQLite file (or in memory)."""

    def __init__(self, url: str, *, min_free_bytes: int = 0) -> None:
        """min_free_bytes: new files and jobs are refused (StoreFull) where they would leave
        the disk less free than this (batch.min_free_mb); 0 = no check."""
        if not url.startswith("sqlite:///"):
            raise ValueError(f"{url!r} is not a sqlite:///<path> URL, the only batch store")
        self.path = url.removeprefix("sqlite:///") or ":memory:"
        self.min_free_bytes = min_free_bytes
        self._lock = threading.Lock()
        with self._failing("open"):
            # Autocommit mode, transactions begun IMMEDIATE: a writer takes the lock up front.
            self._db = connect_private(self.path)  # 0600: it holds prompts and results
            for pragma in (f"busy_timeout = {BUSY_TIMEOUT_MS}", "journal_mode = WAL",
                           "synchronous = FULL", "foreign_keys = ON"):  # fmt: skip
                self._db.execute(f"PRAGMA {pragma}")
            create_or_upgrade(self._db)

    # -- jobs ----------------------------------------------------------------------------

    def submit(
        self, *, tenant: str, key_id: str, model: str, api: str, endpoint: str,
        items: Sequence[NewItem], input_file_id: str | None = None, metadata: dict | None = None,
        max_pending: int | None = None,
    ) -> Job:  # fmt: skip
        """Store a job and all its items, queued; committed before it returns.

        max_pending: the most requests the tenant may have queued or running, this job's
        included (None: no limit); BatchQueueFull past it. Counted in the transaction that
        inserts, so concurrent submits cannot pass it together.
        """
        if not items:
            raise ValueError("a batch needs at least one request")
        job = Job(new_id("batch_"), tenant, model, api, endpoint, len(items), 0, 0,
                  time.time(), input_file_id=input_file_id, metadata=dict(metadata or {}))  # fmt: skip
        row = _job_row(job)
        bodies = [json.dumps(it.body) for it in items]
        self._room(sum(map(len, bodies)))
        with self._write() as db:
            if max_pending is not None:
                pending = _pending(db, tenant)
                if pending + len(items) > max_pending:
                    raise BatchQueueFull(pending, max_pending, len(items))
            seq = db.execute(
                f"INSERT INTO jobs (key_id, {JOB_COLUMNS}) VALUES (?, {', '.join('?' * len(row))})",
                (key_id, *row),
            ).lastrowid
            db.executemany(
                "INSERT INTO items (job, idx, ref, body, state, tenant) VALUES (?, ?, ?, ?, ?, ?)",
                ((seq, i, it.ref, body, QUEUED, tenant)
                 for i, (it, body) in enumerate(zip(items, bodies, strict=True))),
            )  # fmt: skip
        return job

    def job(self, tenant: str, job_id: str) -> Job | None:
        """tenant's job, None if it has none of that id (another tenant's looks the same)."""
        row = self._read_one(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND tenant = ?", (job_id, tenant)
        )
        return _job(row) if row else None

    def jobs(self, tenant: str, *, limit: int = 20, after: str | None = None) -> list[Job]:
        """tenant's jobs, newest first; after: a job id, to list those older than it."""
        clause, args = "", [tenant]
        if after is not None:
            clause = " AND seq < (SELECT seq FROM jobs WHERE id = ? AND tenant = ?)"
            args = [tenant, after, tenant]
        with self._reading() as db:
            rows = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ?{clause} "
                "ORDER BY seq DESC LIMIT ?", (*args, limit),
            ).fetchall()  # fmt: skip
        return [_job(row) for row in rows]

    def cancel(self, tenant: str, job_id: str) -> Job | None:
        """Stop taking tenant's job's items; those already running finish and are kept."""
        with self._write() as db:
            seq = job_seq(db, tenant, job_id)
            if seq is None:
                return None
            now = time.time()
            db.execute("UPDATE jobs SET cancelling = ? WHERE seq = ? AND cancelling IS NULL "
                       "AND expired IS NULL AND finished IS NULL", (now, seq))  # fmt: skip
            db.execute("UPDATE items SET state = ? WHERE job = ? AND state = ?",
                       (CANCELLED, seq, QUEUED))  # fmt: skip
            close_if_ended(db, seq, now)
        return self.job(tenant, job_id)

    def expire(self, ttl_s: float, now: float | None = None) -> int:
        """Delete jobs finished more than ttl_s ago, with their items, and files older than
        that which no unfinished job reads; how many jobs went."""
        cutoff = (time.time() if now is None else now) - ttl_s
        with self._write() as db:
            gone = db.execute("DELETE FROM jobs WHERE finished < ?", (cutoff,)).rowcount
            db.execute(
                "DELETE FROM files WHERE created < ? AND id NOT IN (SELECT input_file_id FROM "
                "jobs WHERE finished IS NULL AND input_file_id IS NOT NULL)", (cutoff,),
            )  # fmt: skip
        return gone

    def pending(self, tenant: str) -> int:
        """tenant's requests queued or running, over all its jobs."""
        with self._reading() as db:
            return _pending(db, tenant)

    def holdings(self, tenant: str) -> BatchHoldings:
        """What tenant's batch quotas count now: its files, their bytes, its pending requests."""
        with self._reading() as db:
            return BatchHoldings(*file_totals(db, tenant), _pending(db, tenant))

    def queued(self) -> int:
        """Items waiting to be taken, over every job."""
        with self._reading() as db:
            return db.execute("SELECT COUNT(*) FROM items WHERE state = ?", (QUEUED,)).fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction, committed when the block ends, rolled back if it raises."""
        with self._lock, self._failing("write to"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # A COMMIT that fails (a full disk) may leave the transaction open: every
                # later BEGIN would then fail too, so it is rolled back here either way.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._failing("read"):
            yield self._db

    def _read_one(self, sql: str, args: tuple) -> tuple | None:
        with self._reading() as db:
            return db.execute(sql, args).fetchone()

    def _room(self, size: int) -> None:
        """StoreFull unless writing about size bytes leaves the disk min_free_bytes free: new
        work is refused while what is already accepted can still write its results."""
        if self.path == ":memory:":
            return
        with self._failing("measure the disk of"):
            short = shortfall(Path(self.path).parent, self.min_free_bytes, size)
        if short is not None:
            raise StoreFull(f"batch store {self.path}: {short}")

    @contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        try:
            yield
        except (OSError, sqlite3.Error) as exc:
            kind = StoreFull if disk_full(exc) else BatchStoreError
            raise kind(f"batch store {self.path}: cannot {action} it: {exc}") from exc


def _pending(db: sqlite3.Connection, tenant: str) -> int:
    # Only open jobs hold such items: an ended job's are done, failed, cancelled or expired.
    # An item of a job still taking items is queued, running, done or failed, and the job
    # counts the done and failed ones; a stopping job's (cancelled or expired) queued ones
    # were dropped, so count its items.
    left = db.execute(
        "SELECT COALESCE(SUM(total - completed - failed), 0) FROM jobs WHERE tenant = ? AND "
        "finished IS NULL AND cancelling IS NULL AND expired IS NULL", (tenant,),
    ).fetchone()[0]  # fmt: skip
    stopping = db.execute(
        "SELECT COALESCE(SUM((SELECT COUNT(*) FROM items WHERE state IN (?, ?) AND job = seq)),"
        " 0) FROM jobs WHERE tenant = ? AND finished IS NULL AND (cancelling IS NOT NULL OR "
        "expired IS NOT NULL)", (QUEUED, RUNNING, tenant),
    ).fetchone()[0]  # fmt: skip
    return left + stopping


def _job_row(job: Job) -> tuple:
    return (job.id, job.tenant, job.model, job.api, job.endpoint, job.total, job.completed,
            job.failed, job.created, job.started, job.finished, job.cancelling,
            job.input_file_id, json.dumps(job.metadata), job.prompt_tokens,
            job.completion_tokens, job.cached_tokens, job.expired, job.output_bytes,
            job.error_bytes)  # fmt: skip


def _job(row: tuple) -> Job:
    fields = list(row)
    fields[13] = json.loads(fields[13] or "{}")
    return Job(*fields)
