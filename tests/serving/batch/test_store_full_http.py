"""A batch store whose disk is nearly full (below batch.min_free_mb, or SQLite's SQLITE_FULL):
new files and batches get 507 with a JSON error on every route that makes them, before a
write fails, while reads, cancels and deletes go on; deleting frees the room again."""

import json

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.batch.local_store import LocalBatch
from serving.batch import space
from serving.batch.store import BatchStore
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, MODEL_ID, stub_settings

MIB = 2**20
QUEUE = f"/ai/run/{MODEL_ID}?queueRequest=true"
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
        "body": {"model": MODEL_ID, "prompt": "hi", "max_tokens": 1}}  # fmt: skip


@pytest.fixture
def served(world, tmp_path, url):
    held = Held()
    batch = LocalBatch(BatchStore(url, min_free_bytes=256 * MIB), max_in_flight=1, ttl_s=60)
    app = create_app(held, stub_settings(world, tmp_path), batch=batch)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, batch.store
        held.release.set()


def upload(client, prompt="hi"):
    line = {**LINE, "body": {**LINE["body"], "prompt": prompt}}
    files = {"file": ("in.jsonl", json.dumps(line).encode())}
    return client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=auth(ACME))


def create(client, file_id):
    body = {"input_file_id": file_id, "endpoint": "/v1/completions"}
    return client.post("/v1/batches", json=body, headers=auth(ACME))


def queue(client, prompt="hi"):
    return client.post(QUEUE, json={"requests": [{"prompt": prompt}]}, headers=auth(ACME))


def test_new_files_and_batches_get_507_below_the_floor_and_the_rest_works(served, monkeypatch):
    client, _ = served
    file_id = upload(client).json()["id"]
    batch_id = create(client, file_id).json()["id"]
    monkeypatch.setattr(space, "free_bytes", lambda folder: 200 * MIB)  # under 256 MiB
    r = upload(client)
    assert r.status_code == 507
    error = r.json()["error"]
    assert error["code"] == "insufficient_storage" and "nearly full" in error["message"]
    assert create(client, file_id).status_code == 507
    r = queue(client)
    assert r.status_code == 507 and r.json()["success"] is False
    assert "nearly full" in r.json()["errors"][0]["message"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", "/v1/files",
                 f"/v1/batches/{batch_id}", "/v1/batches"):  # fmt: skip
        assert client.get(path, headers=auth(ACME)).status_code == 200, path
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=auth(ACME)).status_code == 200
    assert client.delete(f"/v1/files/{file_id}", headers=auth(ACME)).status_code == 200
    monkeypatch.setattr(space, "free_bytes", lambda folder: 10_000 * MIB)  # room again
    assert upload(client).status_code == 200 and queue(client).status_code == 200


def test_a_full_database_answers_507_not_500(served):
    client, store = served
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # every page taken: SQLITE_FULL
    r = upload(client, "x" * 100_000)  # more than the pages left free hold
    assert r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage"
    r = queue(client, "x" * 100_000)
    assert r.status_code == 507
    assert client.get("/v1/files", headers=auth(ACME)).status_code == 200
