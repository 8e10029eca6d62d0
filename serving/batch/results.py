"""A job's results read from the batch store a bounded page at a time, by the items table's
key (job, idx): one read holds a page, whatever the job's size."""

from __future__ import annotations

import json
import sqlite3

from serving.batch.records import ItemRecord, ItemResult

# A page of a job's results (results_page): what one read holds, whatever the job's size
PAGE_ITEMS, PAGE_BYTES = 512, 1 << 20


class ResultPages:
    """The result reads of BatchStore, over its connection (_reading, _write)."""

    def results(self, tenant: str, job_id: str) -> list[ItemRecord] | None:
        """Every item of tenant's job in order, with its result once it has one."""
        records = self.results_page(tenant, job_id)
        page = records
        while page:
            page = self.results_page(tenant, job_id, after=page[-1].index) or []
            records += page
        return records

    def results_page(self, tenant: str, job_id: str, after: int = -1) -> list[ItemRecord] | None:
        """The next items of tenant's job after index `after`, in order: at most PAGE_ITEMS,
        and none past the one that brings PAGE_BYTES of results; [] past the last item, None
        when tenant has no such job."""
        with self._reading() as db:
            seq = job_seq(db, tenant, job_id)
            if seq is None:
                return None
            rows, size = [], 0
            cursor = db.execute(
                "SELECT idx, ref, state, status, result, error, prompt_tokens, completion_tokens, "
                "cached_tokens FROM items WHERE job = ? AND idx > ? ORDER BY idx LIMIT ?",
                (seq, after, PAGE_ITEMS),
            )  # fmt: skip
            for row in cursor:  # keyset on the primary key: each page one index range scan
                rows.append(row)
                size += len(row[4] or "") + len(row[5] or "")
                if size >= PAGE_BYTES:
                    break
            cursor.close()
        return [_record(row) for row in rows]  # parsed outside the lock

    def keep_results_bytes(self, tenant: str, job_id: str, errors: bool, size: int) -> None:
        """Keep the measured size of tenant's ended job's output file (errors: its error
        file), read back as Job.output_bytes (error_bytes); nothing for a job not ended."""
        column = "error_bytes" if errors else "output_bytes"
        with self._write() as db:  # an ended job's items never change: the size holds
            db.execute(f"UPDATE jobs SET {column} = ? WHERE id = ? AND tenant = ? AND "
                       "finished IS NOT NULL", (size, job_id, tenant))  # fmt: skip


def job_seq(db: sqlite3.Connection, tenant: str, job_id: str) -> int | None:
    """The row key (seq) of tenant's job, None if it has none of that id."""
    row = db.execute("SELECT seq FROM jobs WHERE id = ? AND tenant = ?", (job_id, tenant))
    found = row.fetchone()
    return found[0] if found else None


def _record(row: tuple) -> ItemRecord:
    idx, ref, state, status, body, error, *tokens = row
    result = None
    if status is not None:
        result = ItemResult(status, json.loads(body) if body else None, error, *tokens)
    return ItemRecord(idx, ref, state, result)
