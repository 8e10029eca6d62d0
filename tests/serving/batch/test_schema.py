"""The batch store's schema: a tenant's file quotas are counted from an index of its own files,
and a store file made before that index and the jobs' kept file sizes opens with both added."""

import sqlite3

from serving.batch.records import BatchHoldings, NewItem
from serving.batch.store import BatchStore


def _plan_of_file_totals(store: BatchStore) -> str:
    """How SQLite runs the statement that counts a tenant's files for its quotas."""
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    try:
        store.holdings("acme")
    finally:
        store._db.set_trace_callback(None)
    (counting,) = [sql for sql in seen if "FROM files" in sql]
    plan = store._db.execute(f"EXPLAIN QUERY PLAN {counting}").fetchall()
    return " | ".join(row[-1] for row in plan)


def test_the_file_quota_count_reads_only_the_tenants_index_entries(store):
    for tenant in ("acme", "globex"):
        store.add_file(tenant, "batch", "in.jsonl", b"{}\n" * 10)
    plan = _plan_of_file_totals(store)
    assert "COVERING INDEX files_by_tenant" in plan and "SCAN" not in plan, plan
    held = store.holdings("acme")
    assert (held.files, held.file_bytes) == (1, 30)


def test_a_store_file_from_before_the_index_and_the_kept_sizes_opens_and_counts(url):
    old = BatchStore(url)
    old.add_file("acme", "batch", "a.jsonl", b"{}\n")
    job = old.submit(tenant="acme", key_id="k", model="demo", api="openai",
                     endpoint="/v1/completions", items=[NewItem({"prompt": "hi"})])  # fmt: skip
    old.close()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as raw:  # as an older version left it
        raw.execute("DROP INDEX files_by_tenant")
        raw.execute("ALTER TABLE jobs DROP COLUMN output_bytes")
        raw.execute("ALTER TABLE jobs DROP COLUMN error_bytes")
    store = BatchStore(url)
    try:
        assert "COVERING INDEX files_by_tenant" in _plan_of_file_totals(store)
        assert store.job("acme", job.id) == job and job.output_bytes is None
        assert store.holdings("acme") == BatchHoldings(1, 3, 1)
        store.cancel("acme", job.id)  # nothing ran: it ends at once, its sizes can be kept
        store.keep_results_bytes("acme", job.id, True, 123)
        ended = store.job("acme", job.id)
        assert (ended.output_bytes, ended.error_bytes) == (None, 123)
    finally:
        store.close()
