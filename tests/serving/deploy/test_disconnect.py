"""DisconnectOnCancel: Ray's cancellation of a request reaches the app as a disconnect."""

import asyncio

import httpx
from fastapi import FastAPI, Request
from ray.exceptions import TaskCancelledError
from sse_starlette import EventSourceResponse

from serving.deploy.disconnect import DisconnectOnCancel


def test_a_cancelled_receive_is_a_disconnect_to_a_streamed_answer():
    app, seen = FastAPI(), {}

    @app.get("/stream")
    async def stream(request: Request):
        async def events():
            for i in range(1000):
                if await request.is_disconnected():
                    seen["left"] = i
                    return
                yield {"data": str(i)}
                await asyncio.sleep(0.001)

        return EventSourceResponse(events())

    app.add_middleware(DisconnectOnCancel)

    async def run():
        calls = 0

        async def cancelled_by_ray():  # what Ray Serve's receive does once it cancels
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.sleep(0.05)
            raise TaskCancelledError()

        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/stream", "raw_path": b"/stream",
                 "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
                 "server": ("test", 80), "client": ("c", 1), "root_path": "", "app": app}  # fmt: skip
        await asyncio.wait_for(app(scope, cancelled_by_ray, send), 10)
        return sent

    sent = asyncio.run(run())  # no TaskCancelledError (or group of one) escapes the app
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = b"".join(m.get("body", b"") for m in sent[1:])
    assert b"data: 0" in bodies and b"data: 999" not in bodies  # it ended early


def test_other_errors_and_plain_requests_pass_through():
    app = FastAPI()

    @app.get("/ok")
    async def ok():
        return {"ok": True}

    app.add_middleware(DisconnectOnCancel)
    transport = httpx.ASGITransport(app=app)

    async def get():
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/ok")

    assert asyncio.run(get()).json() == {"ok": True}
