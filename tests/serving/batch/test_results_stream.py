"""Batch results read a bounded page at a time: the store's pages and file chunks, and the
routes that stream them (output and error files, uploaded files, the Workers-AI poll) with
the same bytes as the whole answers they replace."""

import json
import tracemalloc

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.batch.format import file_lines
from serving.api.batch.local_store import LocalBatch
from serving.api.workers_ai.queued import workers_responses, workers_status
from serving.batch.files import CHUNK_BYTES
from serving.batch.records import WORKERS_AI
from serving.batch.results import PAGE_BYTES, PAGE_ITEMS
from serving.batch.store import BatchStoreError
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, stub_settings
from tests.serving.batch.finished_rows import finished_job


@pytest.fixture
def client(world, tmp_path, store):
    app = create_app(Held(), stub_settings(world, tmp_path),
                     batch=LocalBatch(store, max_in_flight=1, ttl_s=3600))  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def poll_body(store, job) -> bytes:
    """The poll's answer rendered whole, as the route returned it before it streamed."""
    records = store.results("acme", job.id)
    result = workers_status(job, workers_responses(records))
    return JSONResponse({"result": result, "success": True, "errors": [], "messages": []}).body


def test_results_come_in_bounded_pages_by_index(store):
    job = finished_job(store, 2 * PAGE_ITEMS + 7, failed_every=5, cancelled_from=PAGE_ITEMS + 3)
    pages, after = [], -1
    while page := store.results_page("acme", job.id, after):
        pages.append(page)
        after = page[-1].index
    assert [len(p) for p in pages] == [PAGE_ITEMS, PAGE_ITEMS, 7]
    assert [r for p in pages for r in p] == store.results("acme", job.id)
    assert [r.index for p in pages for r in p] == list(range(2 * PAGE_ITEMS + 7))
    assert store.results_page("acme", job.id, after) == []
    assert store.results_page("globex", job.id) is None  # another tenant's job: none
    assert store.results_page("acme", "batch_nope") is None


def test_a_page_stops_at_its_byte_bound(store):
    job = finished_job(store, 6)
    big = json.dumps({"text": "x" * (PAGE_BYTES // 3)})
    with store._write() as db:
        db.execute("UPDATE items SET result = ?", (big,))
    first = store.results_page("acme", job.id)
    assert [r.index for r in first] == [0, 1, 2]  # the third takes it past PAGE_BYTES
    assert [r.index for r in store.results_page("acme", job.id, 2)] == [3, 4, 5]


def test_a_file_is_read_in_chunks_without_loading_it_whole(store):
    content = bytes(range(256)) * (12 * 2**20 // 256 + 3)  # 12 MiB and a bit
    f = store.add_file("acme", "batch", "in.jsonl", content)
    tracemalloc.start()
    try:
        chunks, offset, most = [], 0, 0
        while chunk := store.file_chunk("acme", f.id, offset):
            offset += len(chunk)
            chunks.append(hash(chunk))
            most = max(most, tracemalloc.get_traced_memory()[1])
            del chunk
    finally:
        tracemalloc.stop()
    assert offset == len(content) and len(chunks) == -(-len(content) // CHUNK_BYTES)
    assert most < 4 * CHUNK_BYTES, most  # never the 12 MiB
    assert store.file_chunk("acme", f.id, 5) == content[5 : 5 + CHUNK_BYTES]
    assert store.file_chunk("acme", f.id, len(content) + 9) == b""
    assert store.file_chunk("globex", f.id, 0) is None


@pytest.mark.parametrize("shape", ["mixed", "cancelled", "empty"])
def test_the_workers_poll_is_streamed_with_the_bytes_it_had_whole(client, store, shape):
    n, extra = {"mixed": (2 * PAGE_ITEMS + 5, {"failed_every": 4}),
                "cancelled": (40, {"failed_every": 3, "cancelled_from": 25}),
                "empty": (3, {"cancelled_from": 0})}[shape]  # fmt: skip
    job = finished_job(store, n, api=WORKERS_AI, **extra)
    r = client.post(f"/ai/run/{MODEL_ID}", json={"request_id": job.id}, headers=auth(ACME))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert "content-length" not in r.headers  # sent as it was read, not built whole
    assert r.content == poll_body(store, job)
    answer = r.json()["result"]
    assert len(answer["responses"]) == answer["completed"] + answer["failed"]


@pytest.mark.parametrize("errors", [False, True])
def test_output_and_error_files_stream_every_line(client, store, errors):
    job = finished_job(store, 2 * PAGE_ITEMS + 9, failed_every=7, cancelled_from=PAGE_ITEMS * 2)
    batch = client.get(f"/v1/batches/{job.id}", headers=auth(ACME)).json()
    file_id = batch["error_file_id" if errors else "output_file_id"]
    r = client.get(f"/v1/files/{file_id}/content", headers=auth(ACME))
    assert r.status_code == 200 and r.headers["content-type"] == "application/jsonl"
    assert "content-length" not in r.headers
    assert r.content == file_lines(job, store.results("acme", job.id), errors)
    meta = client.get(f"/v1/files/{file_id}", headers=auth(ACME)).json()
    assert meta["bytes"] == len(r.content)
    other = client.get(f"/v1/files/{file_id}/content", headers=auth(GLOBEX))
    assert other.status_code == 404 and "unknown file" in other.json()["error"]["message"]


def test_an_uploaded_file_streams_in_chunks_with_its_length(client, store):
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": "é" * 300}]}}  # fmt: skip
    content = b"".join(json.dumps({**line, "custom_id": f"r{i}"}).encode() + b"\n"
                       for i in range(3 * CHUNK_BYTES // 700))  # fmt: skip
    up = client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"},
                     headers=auth(ACME))  # fmt: skip
    assert up.status_code == 200, up.text
    store.file_content = None  # its content is read a chunk at a time, never whole
    r = client.get(f"/v1/files/{up.json()['id']}/content", headers=auth(ACME))
    assert r.status_code == 200 and r.content == content
    assert r.headers["content-length"] == str(len(content))
    missing = client.get("/v1/files/file-nope/content", headers=auth(ACME))
    assert missing.status_code == 404 and "unknown file" in missing.json()["error"]["message"]


def test_a_store_failing_before_the_first_page_answers_503_not_a_cut_off_200(client, store):
    job = finished_job(store, 3, api=WORKERS_AI)

    def broken(*args):
        raise BatchStoreError(f"batch store {store.path}: cannot read it: disk I/O error")

    store.results_page = broken
    r = client.post(f"/ai/run/{MODEL_ID}", json={"request_id": job.id}, headers=auth(ACME))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
