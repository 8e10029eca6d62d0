"""The feeder's side of the batch store: items taken, put back and finished.

Items move queued -> running -> done | failed; the move to done or failed writes the result
and the job's counts in one transaction, and only from running, so each item's result is
committed exactly once however often it runs.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
import time
from typing import NamedTuple

from serving.batch.records import (
    CANCELLED,
    DONE,
    EXPIRED,
    FAILED,
    OPENAI,
    QUEUED,
    RUNNING,
    Item,
    ItemResult,
)


class ItemQueue:
    """The feeder's calls of BatchStore, over its connection (_write)."""

    def claim(self, n: int) -> list[Item]:
        """Up to n queued items, now running, in the feeder's order.

        Tenants take turns, the one with the fewest items running first (then the one whose
        oldest open job is oldest), so a tenant's share does not grow with its jobs. Within a
        tenant, the i-th item of every job comes before any job's (i+1)-th, so its small job
        is not stuck behind its large one; then oldest job first.
        """
        if n < 1:
            return []
        with self._write() as db:
            running = dict(db.execute(
                "SELECT tenant, COUNT(*) FROM items WHERE state = ? GROUP BY tenant", (RUNNING,)
            ).fetchall())  # fmt: skip
            turns = [
                (running.get(tenant, 0), oldest, tenant)
                for tenant, oldest in db.execute(
                    "SELECT tenant, MIN(seq) FROM jobs WHERE finished IS NULL AND cancelling "
                    "IS NULL GROUP BY tenant"
                )
            ]
            heapq.heapify(turns)
            rows, now = [], time.time()
            while turns and len(rows) < n:
                count, oldest, tenant = heapq.heappop(turns)
                row = _take_next(db, tenant, now)
                if row is not None:  # else the tenant has nothing queued: its turns end
                    rows.append(row)
                    heapq.heappush(turns, (count + 1, oldest, tenant))
        return [
            Item(job_id, idx, tenant, key_id, model, endpoint, json.loads(body), ref, attempt)
            for idx, job_id, tenant, key_id, model, endpoint, body, ref, attempt in rows
        ]

    def release(self, item: Item) -> bool:
        """Put a running item back in the queue (a transient failure: it runs again), or,
        when its job was cancelled meanwhile, drop it as the job's queued items were."""
        with self._write() as db:
            row = db.execute("SELECT seq, cancelling FROM jobs WHERE id = ?", (item.job_id,))
            found = row.fetchone()
            if found is None:
                return False
            seq, cancelling = found
            state = CANCELLED if cancelling is not None else QUEUED
            changed = db.execute(
                "UPDATE items SET state = ? WHERE job = ? AND idx = ? AND state = ?",
                (state, seq, item.index, RUNNING),
            ).rowcount  # fmt: skip
            if changed and state == CANCELLED:
                close_if_ended(db, seq, time.time())
            return changed > 0

    def finish(self, item: Item, result: ItemResult) -> bool:
        """Commit item's result and its job's counts; False (and nothing written) when the
        item is no longer running: its result is already in, or its job was deleted."""
        with self._write() as db:
            row = db.execute("SELECT seq FROM jobs WHERE id = ?", (item.job_id,)).fetchone()
            if row is None:
                return False
            seq = row[0]
            state = DONE if result.ok else FAILED
            tokens = (result.prompt_tokens, result.completion_tokens, result.cached_tokens)
            body = json.dumps(result.body) if result.body is not None else None
            changed = db.execute(
                "UPDATE items SET state = ?, status = ?, result = ?, error = ?, prompt_tokens = ?,"
                " completion_tokens = ?, cached_tokens = ? WHERE job = ? AND idx = ? AND state = ?",
                (state, result.status, body, result.error, *tokens, seq, item.index, RUNNING),
            ).rowcount  # fmt: skip
            if not changed:
                return False
            column = "completed" if result.ok else "failed"
            db.execute(
                f"UPDATE jobs SET {column} = {column} + 1, prompt_tokens = prompt_tokens + ?, "
                "completion_tokens = completion_tokens + ?, cached_tokens = cached_tokens + ? "
                "WHERE seq = ?", (*tokens, seq),
            )  # fmt: skip
            close_if_ended(db, seq, time.time())
        return True

    def close_overdue(self, window_s: float, now: float | None = None) -> int:
        """End the OpenAI jobs submitted more than window_s ago: their queued items expire
        (never run), those running finish and are kept; how many jobs this closed."""
        now = time.time() if now is None else now
        with self._write() as db:
            overdue = [seq for (seq,) in db.execute(
                "SELECT seq FROM jobs WHERE finished IS NULL AND cancelling IS NULL AND "
                "expired IS NULL AND api = ? AND created < ?", (OPENAI, now - window_s),
            )]  # fmt: skip
            for seq in overdue:
                db.execute("UPDATE jobs SET expired = ? WHERE seq = ?", (now, seq))
                db.execute("UPDATE items SET state = ? WHERE job = ? AND state = ?",
                           (EXPIRED, seq, QUEUED))  # fmt: skip
                close_if_ended(db, seq, now)
        return len(overdue)

    def requeue_running(self, max_attempts: int | None = None) -> Requeued:
        """Put back every running item (its runner died before committing). A cancelled or
        expired job's are dropped instead, as its queued ones were; one that has run max_attempts
        times already fails (a request that takes its server down with it must not do so on
        every restart)."""
        now = time.time()
        with self._write() as db:
            ended = db.execute(
                "UPDATE items SET state = ? WHERE state = ? AND job IN (SELECT seq FROM jobs "
                "WHERE cancelling IS NOT NULL) RETURNING job", (CANCELLED, RUNNING),
            ).fetchall()  # fmt: skip
            ended += db.execute(
                "UPDATE items SET state = ? WHERE state = ? AND job IN (SELECT seq FROM jobs "
                "WHERE expired IS NOT NULL) RETURNING job", (EXPIRED, RUNNING),
            ).fetchall()  # fmt: skip
            given_up = []
            if max_attempts is not None:
                given_up = db.execute(
                    "UPDATE items SET state = ?, status = 500, error = ? WHERE state = ? AND "
                    "attempts >= ? RETURNING job",
                    (FAILED, _gave_up(max_attempts), RUNNING, max_attempts),
                ).fetchall()  # fmt: skip
            for (seq,) in given_up:
                db.execute("UPDATE jobs SET failed = failed + 1 WHERE seq = ?", (seq,))
            for seq in {row[0] for row in ended + given_up}:
                close_if_ended(db, seq, now)
            requeued = db.execute(
                "UPDATE items SET state = ? WHERE state = ?", (QUEUED, RUNNING)
            ).rowcount
        return Requeued(requeued, len(given_up))


class Requeued(NamedTuple):
    """What requeue_running did: items put back to run again, and items failed instead."""

    requeued: int
    failed: int


def _gave_up(attempts: int) -> str:
    return (f"this request has run {attempts} times, the last one as its server stopped; "
            "it is not run again")  # fmt: skip


def close_if_ended(db: sqlite3.Connection, seq: int, now: float) -> None:
    """Mark the job finished once none of its items is queued or running."""
    db.execute(
        "UPDATE jobs SET finished = ? WHERE seq = ? AND finished IS NULL AND NOT EXISTS "
        "(SELECT 1 FROM items WHERE job = ? AND state IN (?, ?))", (now, seq, seq, QUEUED, RUNNING),
    )  # fmt: skip


def _take_next(db: sqlite3.Connection, tenant: str, now: float) -> tuple | None:
    """Mark tenant's next queued item running (the lowest index over its jobs, then the
    oldest job: one step of the items_tenant_queue index); its row for an Item, or None
    when it has none queued. Only an open job, not being cancelled, has queued items."""
    found = db.execute(
        "SELECT job, idx FROM items WHERE state = ? AND tenant = ? ORDER BY idx, job LIMIT 1",
        (QUEUED, tenant),
    ).fetchone()
    if found is None:
        return None
    seq, idx = found
    db.execute("UPDATE items SET state = ?, attempts = attempts + 1 WHERE job = ? AND idx = ?",
               (RUNNING, seq, idx))  # fmt: skip
    db.execute("UPDATE jobs SET started = ? WHERE seq = ? AND started IS NULL", (now, seq))
    return db.execute(
        "SELECT i.idx, j.id, j.tenant, j.key_id, j.model, j.endpoint, i.body, i.ref, "
        "i.attempts FROM items i JOIN jobs j ON j.seq = i.job WHERE i.job = ? AND i.idx = ?",
        (seq, idx),
    ).fetchone()  # fmt: skip
