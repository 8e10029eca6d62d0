"""The batch store's quotas and room: file counts and bytes counted in the transaction that
inserts (so racing uploads cannot all pass), a free-space floor that refuses new files and
jobs while reads, cancels and deletes go on, and a full database named as such."""

import sqlite3
import threading

import pytest

from serving.batch import space
from serving.batch.files import FileQuotaFull
from serving.batch.records import NewItem
from serving.batch.store import BatchStore, BatchStoreError, StoreFull

MIB = 2**20


def submit(store, n=1, **kw):
    return store.submit(tenant="acme", key_id="k", model="demo", api="openai",
                        endpoint="/v1/completions", items=[NewItem({"prompt": "hi"})] * n, **kw)  # fmt: skip


def test_racing_uploads_never_pass_the_file_count_together(url):
    stores = [BatchStore(url) for _ in range(4)]  # four connections, as several processes
    landed, refused = [], []
    start = threading.Barrier(16)

    def upload(i):
        start.wait()
        try:
            landed.append(stores[i % 4].add_file("acme", "batch", f"{i}.jsonl", b"x", max_files=5))
        except FileQuotaFull as exc:
            refused.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(landed) == 5 and len(refused) == 11
    assert {e.limit_name for e in refused} == {"batch_files"}
    assert stores[0].holdings("acme").files == 5 and stores[0].holdings("globex").files == 0
    for s in stores:
        s.close()


def test_file_bytes_count_every_file_the_tenant_keeps_until_deleted(store):
    a = store.add_file("acme", "batch", "a", b"x" * 600, max_bytes=1000)
    with pytest.raises(FileQuotaFull) as exc:
        store.add_file("acme", "batch", "b", b"x" * 500, max_bytes=1000)
    assert (exc.value.limit_name, exc.value.used, exc.value.limit, exc.value.asked) == (
        "batch_file_mb", 600, 1000, 500)  # fmt: skip
    store.add_file("globex", "batch", "b", b"x" * 500, max_bytes=1000)  # another tenant's own
    assert store.delete_file("acme", a.id)
    store.add_file("acme", "batch", "b", b"x" * 500, max_bytes=1000)
    held = store.holdings("acme")
    assert (held.files, held.file_bytes, held.pending) == (1, 500, 0)


def test_below_the_free_space_floor_new_work_is_refused_and_the_rest_goes_on(url, monkeypatch):
    store = BatchStore(url, min_free_bytes=256 * MIB)
    kept = store.add_file("acme", "batch", "a", b"x")
    job = submit(store, 3)
    monkeypatch.setattr(space, "free_bytes", lambda folder: 300 * MIB)
    with pytest.raises(StoreFull, match="leave less than the 256 MiB kept free"):
        store.add_file("acme", "batch", "big", b"x" * 50 * MIB)  # 300 - 50 < 256
    store.add_file("acme", "batch", "small", b"x")  # what still fits above the floor
    monkeypatch.setattr(space, "free_bytes", lambda folder: 100 * MIB)
    with pytest.raises(StoreFull, match=r"100 MiB free.*batch\.min_free_mb"):
        submit(store)
    with pytest.raises(StoreFull):
        store.add_file("acme", "batch", "b", b"x")
    assert store.job("acme", job.id).total == 3 and store.file_content("acme", kept.id) == b"x"
    assert store.cancel("acme", job.id).cancelling is not None
    assert store.delete_file("acme", kept.id)
    assert store.holdings("acme").pending == 0
    store.close()


def test_a_floor_of_zero_never_measures_the_disk(store, monkeypatch):
    def unmeasured(folder):
        raise AssertionError("measured")

    monkeypatch.setattr(space, "free_bytes", unmeasured)
    store.add_file("acme", "batch", "a", b"x")
    submit(store)


def test_a_full_database_is_store_full_and_later_writes_still_work(store):
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # as a disk with no room left
    with pytest.raises(StoreFull, match="full") as exc:
        store.add_file("acme", "batch", "a", b"x" * 100_000)
    assert isinstance(exc.value, BatchStoreError)  # the feeder's handling still applies
    assert isinstance(exc.value.__cause__, sqlite3.OperationalError)
    store._db.execute(f"PRAGMA max_page_count = {pages * 1000}")  # space freed
    assert store.add_file("acme", "batch", "a", b"x" * 100_000).bytes == 100_000
