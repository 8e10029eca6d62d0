"""The batch store's SQLite schema, and the upgrades that bring files made by older versions
to it when they are opened (columns added since, filled from what the file holds)."""

from __future__ import annotations

import sqlite3

# A job row's columns in Job's field order (serving.batch.records), after its seq and key_id
JOB_COLUMNS = (
    "id, tenant, model, api, endpoint, total, completed, failed, created, started, finished, "
    "cancelling, input_file_id, metadata, prompt_tokens, completion_tokens, cached_tokens, "
    "expired, output_bytes, error_bytes"
)
# Job columns added since the first version: an older file gets them, all NULL (_with_job_columns)
_LATER_JOB_COLUMNS = ("expired", "output_bytes", "error_bytes")
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key_id TEXT NOT NULL,
    {JOB_COLUMNS},  -- untyped: SQLite keeps what each is given
    UNIQUE (id)
);
CREATE TABLE IF NOT EXISTS items (
    job INTEGER NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
    idx INTEGER NOT NULL, ref TEXT, body TEXT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, status INTEGER, result TEXT, error TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, tenant TEXT,  -- the job's: a tenant's queue
    PRIMARY KEY (job, idx)
) WITHOUT ROWID;
-- A job's next queued item, and the items in one state, without reading the others
-- (items_queued, its order before tenants took turns, is dropped from older files).
DROP INDEX IF EXISTS items_queued;
CREATE INDEX IF NOT EXISTS items_state ON items (state, job, idx);
-- The open jobs of a tenant, and of every tenant, without reading the ended ones.
CREATE INDEX IF NOT EXISTS jobs_open ON jobs (tenant, seq) WHERE finished IS NULL;
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created REAL NOT NULL, content BLOB NOT NULL
);
-- A tenant's files without reading any other's: its quotas' count and sum from the index
-- alone (the rows hold the content), its listing in order.
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, created, id, bytes);
"""


def create_or_upgrade(db: sqlite3.Connection) -> None:
    """The tables and indexes, made where missing; an older file's missing columns added."""
    db.executescript(_SCHEMA)
    _with_item_tenants(db)
    _with_job_columns(db)


def _with_item_tenants(db: sqlite3.Connection) -> None:
    """Give a file made before items named their tenant that column, filled from the jobs,
    and the index a tenant's next queued item is read from (the feeder's order within a
    tenant: the i-th item of each of its jobs before any job's (i+1)-th, then oldest job)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
    if "tenant" not in columns:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ALTER TABLE items ADD COLUMN tenant TEXT")
        db.execute("UPDATE items SET tenant = (SELECT tenant FROM jobs WHERE seq = items.job)")
        db.execute("COMMIT")
    db.execute("CREATE INDEX IF NOT EXISTS items_tenant_queue ON items (state, tenant, idx, job)")


def _with_job_columns(db: sqlite3.Connection) -> None:
    """Give a file made before jobs could expire, or kept their files' sizes, those columns:
    all NULL (never expired; sizes measured at their next read)."""
    have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    for column in _LATER_JOB_COLUMNS:
        if column not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {column}")
