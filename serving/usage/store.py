"""Usage metering in SQLite: requests and tokens per tenant, key, adapter and kind, by the minute.

Each finished request adds its counts to one row per (minute, tenant, key_id, adapter, kind),
so the table grows with the minutes that saw traffic, not with the number of requests, and
grouping by day or filtering by time still works. The price is resolution: a range's start
and end each resolve to the start of their minute, and the range is half-open, the minutes
from start's up to but not including end's. So ranges that meet (one ending at T, the next
starting at T) share no minute and miss none, whether or not T is on a minute: a day-by-day
export bills each minute once. (Rounding end up instead would count end's minute in both.)

The database runs in WAL mode with a busy timeout, so several processes (replicas, a batch
feeder) can write one file at once; record() commits before it returns. A write that fails (a
full disk, a database locked too long) goes to a spool file beside the database instead and
is replayed, exactly once, by the next write that succeeds or the next start (serving.usage
.spool). A record that carries an id (one a replica may send twice: serving.usage.outbox) is
counted the first time its id comes, within DELIVERED_KEEP_S. A UsageStore object is safe to
share between threads.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from serving.private_sqlite import connect_private
from serving.usage.record import COUNTS, KINDS, UsageRecord, empty_counts, minute_of
from serving.usage.spool import Row, Spool

# group_by -> (the group's key in a row, its SQL); day is the UTC date of the minute.
GROUPS = {
    "adapter": ("adapter", "adapter"),
    "key": ("key_id", "key_id"),
    "day": ("day", "strftime('%Y-%m-%d', minute, 'unixepoch')"),
    "tenant": (None, "''"),
}
BUSY_TIMEOUT_MS = 30_000  # writers wait this long for another process's transaction
# How long a delivered record's id is kept to count it once: a replica sends a record again
# within seconds or minutes (its outbox's replays); one sent again later than this, after a
# first delivery that had committed unanswered, would be counted twice.
DELIVERED_KEEP_S = 24 * 3600
log = logging.getLogger("loraserve.usage")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    minute INTEGER NOT NULL,  -- epoch seconds of the minute's start (UTC)
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    adapter TEXT NOT NULL,
    kind TEXT NOT NULL,
    requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    PRIMARY KEY (minute, tenant, key_id, adapter, kind)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_by_tenant ON usage (tenant, minute);
-- The spool lines (serving.usage.spool) committed and not yet cleared from the spool file.
CREATE TABLE IF NOT EXISTS usage_spooled (id TEXT PRIMARY KEY) WITHOUT ROWID;
-- The ids of the records counted that came with one (UsageRecord.id), by their minute, kept
-- DELIVERED_KEEP_S: such a record is counted once however often it is sent.
CREATE TABLE IF NOT EXISTS usage_delivered (
    minute INTEGER NOT NULL, id TEXT NOT NULL, PRIMARY KEY (minute, id)
) WITHOUT ROWID;
"""
_UPSERT = f"""
INSERT INTO usage (minute, tenant, key_id, adapter, kind, {", ".join(COUNTS)})
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, tenant, key_id, adapter, kind) DO UPDATE SET
{", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTS)}
"""


class UsageStoreError(RuntimeError):
    """A usage database that cannot be opened or used; the message names its path."""


class UsageStore:
    """Per-minute usage in one SQLite file (or in memory); safe across threads and processes."""

    def __init__(self, url: str) -> None:
        if not url.startswith("sqlite:///"):
            raise ValueError(f"{url!r} is not a sqlite:///<path> URL, the only usage store")
        self.path = url.removeprefix("sqlite:///") or ":memory:"
        self._lock = threading.Lock()
        try:
            # Autocommit mode: transactions are begun explicitly, IMMEDIATE, so a writer takes
            # the write lock up front and waits (busy_timeout) rather than failing on upgrade.
            self._db = connect_private(self.path)  # 0600: who used what is no one else's
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise UsageStoreError(f"usage store {self.path}: cannot open it: {exc}") from None
        # Beside the database (a store in memory has none): what failed writes left.
        self._spool = Spool(f"{self.path}-spool.jsonl") if self.path != ":memory:" else None
        try:  # what a previous run spooled, replayed now rather than at the next request
            if self._spool is not None and not self._spool.empty():
                with self._lock:
                    self._write([])
        except UsageStoreError as exc:
            log.warning("%s; its spooled usage is replayed by a later write", exc)

    def record(self, records: Sequence[UsageRecord]) -> None:
        """Add the records' counts to their minutes, in one transaction committed on return;
        a failing write spools them (durable on return) for a later write to replay, and
        raises UsageStoreError only when the spool cannot take them either."""
        rows: dict[tuple, list[int]] = {}
        for r in records:  # sum in memory first: a batch often repeats a row's key
            key = (minute_of(r.time), r.tenant, r.key_id, r.adapter, r.kind, r.id)
            if r.id is not None and key in rows:
                continue  # the same record twice: counted once
            counts = rows.setdefault(key, [0] * len(COUNTS))
            for i, name in enumerate(COUNTS):
                counts[i] += getattr(r, name)
        if not rows:
            return
        # Rows (Row): a record with an id stays a row of its own, counted once by that id.
        summed = [(*key[:5], *counts, key[5]) for key, counts in rows.items()]
        with self._lock:
            try:
                self._write(summed)
            except UsageStoreError as exc:
                if self._spool is None:
                    raise
                try:
                    self._spool.append(summed)
                except OSError as spool_exc:
                    raise UsageStoreError(f"{exc}; nor can its spool take it: {spool_exc}") from exc
                log.warning("%s; %d usage row(s) spooled to %s", exc, len(summed), self._spool.path)

    def _write(self, rows: list[Row]) -> None:
        """The spooled lines not yet counted, then rows, in one transaction; the spool emptied
        once it has committed. Called under self._lock."""
        with self._failing("write to"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                with self._spooled() as spooled:
                    for line_id, line_rows in spooled:  # in order, each line once
                        new = self._db.execute(
                            "INSERT OR IGNORE INTO usage_spooled VALUES (?)", (line_id,)
                        )
                        if new.rowcount:
                            self._count(line_rows)
                    # ids of lines no longer in the spool: cleared by an earlier replay
                    gone = {row[0] for row in self._db.execute("SELECT id FROM usage_spooled")}
                    gone -= {line_id for line_id, _ in spooled}
                    self._db.executemany("DELETE FROM usage_spooled WHERE id = ?",
                                         [(i,) for i in gone])  # fmt: skip
                    self._count(rows)
                    kept_from = minute_of(time.time() - DELIVERED_KEEP_S)
                    self._db.execute("DELETE FROM usage_delivered WHERE minute < ?", (kept_from,))
                    self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _count(self, rows: list[Row]) -> None:
        """Add rows' counts, a row with an id only if that id was not counted before."""
        fresh = []
        for row in rows:
            first = row[9] is None or self._db.execute(
                "INSERT OR IGNORE INTO usage_delivered VALUES (?, ?)", (row[0], row[9])
            ).rowcount  # fmt: skip
            if first:
                fresh.append(row[:9])
        self._db.executemany(_UPSERT, fresh)

    @contextmanager
    def _spooled(self) -> Iterator[list]:
        """The spool's lines, held (Spool.held); [] for a store without a spool."""
        if self._spool is None:
            yield []
            return
        with self._spool.held() as spooled:
            yield spooled

    def query(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        group_by: str = "adapter",
        tenant: str | None = None,
    ) -> list[dict]:
        """Usage per tenant and group, interactive and batch apart, sorted; tenant None = all.

        group_by: "adapter" (rows keyed "adapter"), "key" ("key_id"), "day" ("day",
        YYYY-MM-DD in UTC) or "tenant" (the tenant alone). start and end are epoch seconds:
        the range holds the minutes from minute_of(start) up to, not including,
        minute_of(end); None = unbounded. Each row's `last_used` is the start (epoch
        seconds) of the latest minute in the range that the group used.
        """
        if group_by not in GROUPS:
            raise ValueError(f"group_by must be one of {', '.join(GROUPS)}, got {group_by!r}")
        label, column = GROUPS[group_by]
        where, args = _where(start, end, tenant)
        sql = (
            f"SELECT tenant, {column} AS grp, kind, MAX(minute), "
            f"{', '.join(f'SUM({c})' for c in COUNTS)} FROM usage{where} "
            "GROUP BY tenant, grp, kind ORDER BY tenant, grp"
        )
        with self._lock, self._failing("read"):
            found = self._db.execute(sql, args).fetchall()
        rows: dict[tuple[str, str], dict] = {}
        for tenant_name, group, kind, last, *sums in found:
            row = rows.get((tenant_name, group))
            if row is None:
                row = {"tenant": tenant_name, **({label: group} if label else {})}
                row.update({k: empty_counts() for k in KINDS}, last_used=last)
                rows[(tenant_name, group)] = row
            row[kind] = dict(zip(COUNTS, sums, strict=True))
            row["last_used"] = max(row["last_used"], last)
        return list(rows.values())

    def totals(
        self, *, start: float | None = None, end: float | None = None, tenant: str | None = None
    ) -> dict[str, dict[str, int]]:
        """Counts summed over every group: {"interactive": {...}, "batch": {...}}."""
        totals = {k: empty_counts() for k in KINDS}
        for row in self.query(start=start, end=end, group_by="tenant", tenant=tenant):
            for kind in KINDS:
                for name in COUNTS:
                    totals[kind][name] += row[kind][name]
        return totals

    def close(self) -> None:
        """Close the database; closing twice is harmless."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        """sqlite3's errors, raised as UsageStoreError naming the database's path."""
        try:
            yield
        except (OSError, sqlite3.Error) as exc:
            raise UsageStoreError(f"usage store {self.path}: cannot {action} it: {exc}") from exc


def _where(start: float | None, end: float | None, tenant: str | None) -> tuple[str, list]:
    """The WHERE clause: minutes in [minute_of(start), minute_of(end)), of one tenant or all."""
    clauses, args = [], []
    if start is not None:
        clauses.append("minute >= ?")
        args.append(minute_of(start))
    if end is not None:
        clauses.append("minute < ?")
        args.append(minute_of(end))
    if tenant is not None:
        clauses.append("tenant = ?")
        args.append(tenant)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args
