"""limits.batch_queued_requests over HTTP: both batch APIs refuse a submission that would take
the tenant past its requests queued or running, with a 429 that names the count and the limit;
other tenants are not held to it; room comes back as requests end; /v1/stats shows it.

Items run on a generator that holds every request until released, so what is pending is
known exactly."""

import asyncio
import json
import time

import openai
import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.admin import routes_stats
from serving.api.batch.local_store import LocalBatch
from serving.batch.store import BatchStore
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, stub_settings

LIMITS = {"acme": {"batch_queued_requests": 3}}
QUEUE = f"/ai/run/{MODEL_ID}?queueRequest=true"


@pytest.fixture
def app(world, tmp_path):
    held = Held()
    settings = stub_settings(world, tmp_path, limits_of=lambda t: LIMITS.get(t, {}))
    with TestClient(create_app(held, settings), raise_server_exceptions=False) as client:
        yield client, held
        held.release.set()


def queue(client, n, key=ACME):
    body = {"requests": [{"prompt": f"hi {i}", "max_tokens": 2} for i in range(n)]}
    return client.post(QUEUE, json=body, headers=auth(key))


def pending(client, key=ACME) -> int:
    usage = client.get("/v1/stats", headers=auth(key)).json()["usage"]
    return usage["batch_pending"]


def test_workers_ai_queue_is_held_to_the_limit(app):
    client, held = app
    assert queue(client, 2).status_code == 200
    r = queue(client, 2)
    assert r.status_code == 429 and "Retry-After" not in r.headers
    message = r.json()["errors"][0]["message"]
    assert "has 2 batch request(s) queued or running and may have at most 3" in message
    assert queue(client, 1).status_code == 200  # exactly up to the limit
    assert queue(client, 5, key=GLOBEX).status_code == 200  # another tenant: no limit
    stats = client.get("/v1/stats", headers=auth(ACME)).json()["usage"]
    assert stats["batch_pending"] == 3 and stats["limits"]["batch_queued_requests"] == 3
    r = queue(client, 4)
    assert r.status_code == 429
    assert "a batch of 4 requests is more than this tenant's limit of 3" in r.text

    held.release.set()  # every request ends: room again
    deadline = time.monotonic() + 30
    while pending(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pending(client) == 0
    assert queue(client, 3).status_code == 200


def test_openai_batches_are_held_to_the_same_count(app):
    client, _ = app
    assert queue(client, 2).status_code == 200  # the two APIs share one backlog
    c = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=ACME, http_client=client)
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2}}
        for i in range(2)
    ]  # fmt: skip
    data = "\n".join(json.dumps(line) for line in lines).encode()
    f = c.files.create(file=("in.jsonl", data), purpose="batch")
    with pytest.raises(openai.RateLimitError) as exc:
        c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    assert "may have at most 3" in exc.value.message
    assert exc.value.code == "batch_queue_full"
    assert [b.endpoint for b in c.batches.list().data] == ["/ai/run"]  # nothing was stored
    one = c.files.create(file=("one.jsonl", data.splitlines()[0]), purpose="batch")
    c.batches.create(input_file_id=one.id, endpoint="/v1/completions", completion_window="24h")
    assert pending(client) == 3


class _StuckBatch(LocalBatch):
    """A batch client whose store answers how much is pending far too late (a restarting
    replica)."""

    async def pending(self, tenant):
        await asyncio.sleep(5)
        return 7


def test_stats_answer_without_the_backlog_when_the_batch_store_does_not(
    world, tmp_path, monkeypatch
):
    monkeypatch.setattr(routes_stats, "TENANCY_TIMEOUT_S", 0.2)
    settings = stub_settings(world, tmp_path, limits_of=lambda t: LIMITS.get(t, {}))
    batch = _StuckBatch(BatchStore("sqlite:///"), max_in_flight=1, ttl_s=60)
    client = TestClient(create_app(Held(), settings, batch=batch), raise_server_exceptions=False)
    started = time.monotonic()
    r = client.get("/v1/stats", headers=auth(ACME))
    assert r.status_code == 200 and r.json()["usage"]["batch_pending"] is None
    assert time.monotonic() - started < 4
