"""How a generation reaches the client: a full queue is a 429, an invalid request a 400, an
engine failure a JSON 500, and a client that leaves aborts its request in the engine."""

import json
import time
from contextlib import aclosing
from typing import ClassVar

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.api import LocalGenerator, QueueFull, create_app
from serving.engine.request import RequestOutput
from tests.serving.api.served import ACME, MODEL_ID, serve, stub_settings

AUTH = {"Authorization": f"Bearer {ACME}"}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Stub:
    """A generator that fails in a chosen way."""

    def __init__(self, fail):
        self.fail = fail

    async def generate(self, request, *, session=None):
        if isinstance(self.fail, Exception):
            raise self.fail
        yield RequestOutput(request.request_id, (), "", True, "error", 2, 0, error=self.fail)

    async def figures(self):
        return []

    async def ready(self):
        return True


def stub_client(world, tmp_path, fail) -> TestClient:
    app = create_app(Stub(fail), stub_settings(world, tmp_path))
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_is_429_with_retry_after(world, tmp_path, stream):
    client = stub_client(world, tmp_path, QueueFull("3 requests are waiting"))
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = client.post("/ai/run/demo", json={"prompt": "hi"}, headers=AUTH)
    assert r.status_code == 429 and r.json()["errors"][0]["code"] == 429


def test_the_engines_value_error_is_400(world, tmp_path):
    client = stub_client(world, tmp_path, ValueError("this engine serves no adapters"))
    r = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"] == "this engine serves no adapters"


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_error_is_a_json_500(world, tmp_path, stream):
    client = stub_client(world, tmp_path, "adapter x@1: load failed")
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "generation failed: adapter x@1: load failed"


class OwnFault(Stub):
    """A request that yields one token, then fails through its own data (say, its sampling)."""

    async def generate(self, request, *, session=None):
        yield RequestOutput(request.request_id, (5,), "a")
        yield RequestOutput(
            request.request_id, (), "", True, "error", 2, 1, error=self.fail, own_fault=True
        )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/ai/run/demo"])
def test_a_request_failed_by_its_own_data_is_a_400(world, tmp_path, path):
    app = create_app(OwnFault("non-finite probabilities"), stub_settings(world, tmp_path))
    client = TestClient(app, raise_server_exceptions=False)
    body = CHAT if path.startswith("/v1") else {"prompt": "hi"}
    r = client.post(path, json=body, headers=AUTH)
    assert r.status_code == 400 and "non-finite probabilities" in r.text
    # streamed: the status is sent by then, so the error event carries the 400; [DONE] ends it
    r = client.post(path, json={**body, "stream": True}, headers=AUTH)
    events = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    if path.startswith("/ai"):
        assert last["errors"][0]["code"] == 400
    else:
        assert last["error"]["type"] == "invalid_request_error"


class Busy(Stub):
    """A request the engine could not serve now (its schema compiler busy); own: busy with
    the request's own tenant's schemas."""

    own = False

    async def generate(self, request, *, session=None):
        yield RequestOutput(request.request_id, (), "", True, "error", 2, 0, error=self.fail,
                            busy=True, own_fault=self.own)  # fmt: skip


class BusyWithOwn(Busy):
    own = True


def test_a_request_the_engine_is_too_busy_for_is_a_503_with_retry_after(world, tmp_path):
    app = create_app(Busy("the schema compiler is busy"), stub_settings(world, tmp_path))
    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 503 and r.headers["retry-after"] == "10"
    assert "the schema compiler is busy" in r.json()["error"]["message"]


def test_a_request_its_own_tenant_keeps_waiting_is_a_429_with_retry_after(world, tmp_path):
    app = create_app(BusyWithOwn("2 of this tenant's earlier schemas"), stub_settings(world, tmp_path))  # fmt: skip
    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 429 and r.headers["retry-after"] == "10"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert "2 of this tenant's earlier schemas" in r.json()["error"]["message"]
    r = client.post("/ai/run/demo", json={"prompt": "hi"}, headers=AUTH)
    assert r.status_code == 429 and r.json()["errors"][0]["code"] == 429


def test_an_unexpected_fault_is_a_generic_json_500(world, tmp_path):
    client = stub_client(world, tmp_path, KeyError("internal detail"))
    r = client.post("/ai/run/demo", json={"prompt": "hi"}, headers=AUTH)
    assert r.status_code == 500
    assert r.json() == {
        "success": False,
        "errors": [{"code": 500, "message": "internal server error"}],
        "messages": [],
        "result": None,
    }
    assert "internal detail" not in r.text


class Slow(LocalGenerator):
    """The engine's outputs, noting how many tokens were delivered and whether all were."""

    delivered: ClassVar[dict[str, tuple[int, bool]]] = {}

    async def generate(self, request, *, session=None):
        n, finished = 0, False
        try:
            async with aclosing(super().generate(request, session=session)) as stream:
                async for out in stream:
                    n, finished = n + len(out.new_token_ids), out.finished
                    yield out
        finally:
            Slow.delivered[request.request_id] = (n, finished)


@pytest.fixture(scope="module")
def slow(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("slow"), generator_class=Slow) as s:
        model, forward = s.generator.engine.model, s.generator.engine.model.forward

        def slow_forward(*args, **kwargs):  # 30 ms a step: a request outlives its client
            time.sleep(0.03)
            return forward(*args, **kwargs)

        model.forward = slow_forward
        yield s


def closed_after(served, before: set) -> tuple[int, bool]:
    """(outputs delivered, finished) of the one request closed since `before` was taken."""
    deadline = time.monotonic() + 20
    while set(Slow.delivered) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    engine = served.generator.engine
    while engine.scheduler.has_work() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not engine.scheduler.has_work(), "the engine still runs the request"
    (new,) = set(Slow.delivered) - before
    return Slow.delivered[new]


def used(served) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) GET /v1/usage shows the key's tenant."""
    r = httpx.get(served.url + "/v1/usage", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    rows = [row["interactive"] for row in r.json()["data"]]
    return tuple(sum(row[k] for row in rows) for k in ("requests", "prompt_tokens", "completion_tokens"))  # fmt: skip


def billed_since(served, before: tuple[int, int, int]) -> tuple[int, int, int]:
    """What one request left since `before` added to the usage (recorded once it ended)."""
    deadline = time.monotonic() + 10
    while (now := used(served)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    return tuple(a - b for a, b in zip(now, before, strict=True))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/ai/run/demo"])
def test_leaving_a_stream_aborts_the_request_and_bills_what_was_sent(slow, path):
    body = {**CHAT, "max_tokens": 80, "stream": True}
    if path == "/v1/completions":
        body = {"model": MODEL_ID, "prompt": "hi", "max_tokens": 80, "stream": True}
    if path.startswith("/ai"):
        body = {"prompt": "hi", "max_tokens": 80, "stream": True}
    before, usage = set(Slow.delivered), used(slow)
    with httpx.stream("POST", slow.url + path, json=body, headers=AUTH) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data:"))
    delivered, finished = closed_after(slow, before)
    assert not finished and delivered < 80
    # Metered as OpenAI bills a cancelled stream: the prompt, and the tokens sent by then.
    requests, prompt, completion = billed_since(slow, usage)
    assert (requests, completion) == (1, delivered) and prompt > 0


def test_leaving_a_json_request_aborts_it_and_bills_what_was_made(slow):
    before, usage = set(Slow.delivered), used(slow)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            slow.url + "/v1/completions",
            json={"model": MODEL_ID, "prompt": "hi", "max_tokens": 80},
            headers=AUTH,
            timeout=httpx.Timeout(5, read=0.4),
        )
    delivered, finished = closed_after(slow, before)
    assert not finished and delivered < 80
    requests, prompt, completion = billed_since(slow, usage)
    assert (requests, completion) == (1, delivered) and prompt > 0
