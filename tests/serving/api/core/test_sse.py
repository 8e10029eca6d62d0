"""A stream whose client stops reading ends once a write has waited send_timeout_s, and its
request is aborted, so the client's engine slot is freed; a reader that keeps up is served."""

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.engine.request import RequestOutput
from tests.serving.api.served import ACME, MODEL_ID, stub_settings

AUTH = {"Authorization": f"Bearer {ACME}"}
TURN = [{"role": "user", "content": "hi"}]
ROUTES = [
    ("/v1/chat/completions", {"model": MODEL_ID, "messages": TURN, "stream": True}),
    ("/v1/completions", {"model": MODEL_ID, "prompt": "hi", "stream": True}),
    (f"/ai/run/{MODEL_ID}", {"prompt": "hi", "stream": True}),
]


class Endless:
    """A generator whose requests never finish by themselves; notes those that were closed."""

    def __init__(self, num_outputs: int | None = None):
        self.num_outputs, self.closed = num_outputs, []

    async def generate(self, request, *, session=None):
        n = 0
        try:
            while self.num_outputs is None or n < self.num_outputs - 1:
                n += 1
                yield RequestOutput(request.request_id, (7,), "tok ")
                await asyncio.sleep(0.005)
            yield RequestOutput(request.request_id, (7,), "end", True, "length", 2, n + 1)
        finally:
            self.closed.append(request.request_id)

    async def figures(self):
        return []

    async def ready(self):
        return True


def scope_of(path: str, body: bytes) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"authorization", AUTH["Authorization"].encode()),
                    (b"content-length", str(len(body)).encode())],
    }  # fmt: skip


async def stalled_client(
    app, generator: Endless, path: str, body: bytes, closed: int = 1
) -> list[dict]:
    """Run one request whose client reads the headers and a first chunk, then nothing more:
    every later write waits forever, as it does once a socket's buffers are full."""
    sent = []
    requested = False

    async def receive():
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # connected, silent

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            await asyncio.Event().wait()

    await asyncio.wait_for(app(scope_of(path, body), receive, send), timeout=10)
    # aborted by the time the answer ends, not whenever the garbage collector gets to it
    assert len(generator.closed) == closed
    return sent


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_client_that_stops_reading_frees_its_request(world, tmp_path, path, body):
    generator = Endless()
    app = create_app(generator, stub_settings(world, tmp_path, send_timeout_s=0.2))
    sent = asyncio.run(stalled_client(app, generator, path, json.dumps(body).encode()))
    assert sent[0]["status"] == 200 and len(sent) == 2  # the headers, one chunk, no more


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_reader_that_keeps_up_gets_the_whole_stream(world, tmp_path, path, body):
    generator = Endless(num_outputs=40)
    app = create_app(generator, stub_settings(world, tmp_path, send_timeout_s=0.2))
    r = TestClient(app, base_url="http://127.0.0.1").post(path, json=body, headers=AUTH)
    assert r.status_code == 200 and r.text.count("tok ") == 39 and "[DONE]" in r.text
