"""Batch quotas over HTTP: uploads past a tenant's batch_file_mb or batch_files, and batches past
its batch_queued_requests on either batch API, get a 429 naming the quota; limits come from the
config's `limits` (a tenant's own under limits.tenants.NAME); /v1/usage shows each quota's use.
Items run on a generator that holds every request, so what is pending is known exactly."""

import json

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.config import LimitsSection
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, stub_settings

LIMITS = LimitsSection.model_validate(
    {"batch_file_mb": 30, "tenants": {"acme": {"batch_files": 5, "batch_queued_requests": 3}}}
)
QUEUE = f"/ai/run/{MODEL_ID}?queueRequest=true"


@pytest.fixture
def client(world, tmp_path):
    held = Held()
    settings = stub_settings(world, tmp_path, limits_of=LIMITS.for_tenant)
    with TestClient(create_app(held, settings), raise_server_exceptions=False) as c:
        yield c
        held.release.set()


def jsonl(lines: int, prompt_chars: int = 8) -> bytes:
    body = {"model": MODEL_ID, "prompt": "x" * prompt_chars, "max_tokens": 1}
    rows = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": body}
            for i in range(lines)]  # fmt: skip
    return "\n".join(json.dumps(row) for row in rows).encode()


def upload(client, content: bytes, key=ACME):
    files = {"file": ("in.jsonl", content)}
    return client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=auth(key))


def test_the_fourth_large_upload_passes_batch_file_mb_and_is_refused_naming_it(client):
    big = jsonl(95, 100_000)  # 9.5 MB, under the 10 MiB a file may be
    assert 9_400_000 < len(big) < 10 * 2**20
    ids = [upload(client, big).json()["id"] for _ in range(3)]  # 28.5 MB of the 30 MB
    r = upload(client, big)
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["code"] == "insufficient_quota" and "batch_file_mb" in error["message"]
    assert "limit of 30 MB" in error["message"]
    assert upload(client, big, key=GLOBEX).status_code == 200  # each tenant its own 30 MB
    assert client.delete(f"/v1/files/{ids[0]}", headers=auth(ACME)).status_code == 200
    assert upload(client, big).status_code == 200  # deleting frees the space


def test_uploads_past_the_tenants_file_count_are_refused_naming_it(client):
    for _ in range(5):
        assert upload(client, jsonl(1)).status_code == 200
    r = upload(client, jsonl(1))
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    assert "may keep at most 5 (batch_files)" in r.json()["error"]["message"]
    for _ in range(6):  # the default's count (1000) is far off for another tenant
        assert upload(client, jsonl(1), key=GLOBEX).status_code == 200


def test_queued_requests_past_the_tenants_limit_are_refused_on_both_routes(client):
    body = {"requests": [{"prompt": f"hi {i}", "max_tokens": 2} for i in range(2)]}
    assert client.post(QUEUE, json=body, headers=auth(ACME)).status_code == 200
    r = client.post(QUEUE, json=body, headers=auth(ACME))
    assert r.status_code == 429
    assert "(batch_queued_requests)" in r.json()["errors"][0]["message"]
    file_id = upload(client, jsonl(2)).json()["id"]
    r = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions"},
                    headers=auth(ACME))  # fmt: skip
    assert r.status_code == 429 and "(batch_queued_requests)" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "batch_queue_full"


def test_usage_shows_each_quota_used_and_its_limit(client):
    upload(client, jsonl(3))
    upload(client, jsonl(1))
    body = {"requests": [{"prompt": "hi", "max_tokens": 2}] * 2}
    assert client.post(QUEUE, json=body, headers=auth(ACME)).status_code == 200
    quotas = client.get("/v1/usage", headers=auth(ACME)).json()["quotas"]
    size = round((len(jsonl(3)) + len(jsonl(1))) / 2**20, 3)
    assert quotas == {
        "max_adapters": {"used": 0, "limit": None},
        "max_adapter_mb": {"used": 0.0, "limit": None},
        "batch_files": {"used": 2, "limit": 5},
        "batch_file_mb": {"used": size, "limit": 30},
        "batch_queued_requests": {"used": 2, "limit": 3},
    }
    other = client.get("/v1/usage", headers=auth(GLOBEX)).json()["quotas"]
    assert other["batch_files"] == {"used": 0, "limit": 1000}
    assert other["batch_queued_requests"] == {"used": 0, "limit": 100_000}
