"""The proxy middleware: an answer whose app returned mid-body (its replica died) is ended,
an event stream with an error event in its route's style, then [DONE]; finished answers pass untouched;
a client's x-request-id is echoed by Ray's proxy only where the app would echo it."""

import asyncio
import json

import pytest

from serving.deploy.stream_end import CUT_MESSAGE, EndCutStreams, StartingProbe, proxy_middlewares

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def run(app, path: str) -> list[dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    asyncio.run(EndCutStreams(app)(scope, receive, send))
    return sent


def app_cut_after(headers, *bodies):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for body in bodies:
            await send({"type": "http.response.body", "body": body, "more_body": True})

    return app


@pytest.mark.parametrize("path", ["/v1/completions", "/ai/run/demo", "/v1/responses"])
def test_a_cut_event_stream_ends_with_an_error_event_then_done(path):
    sent = run(app_cut_after(SSE, b'data: {"x": 1}\r\n\r\n'), path)
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last["more_body"]
    events = [e.removeprefix("data: ") for e in last["body"].decode().split("\r\n\r\n") if e]
    event = json.loads(events[0])
    message = event["errors"][0]["message"] if path.startswith("/ai") else event["error"]["message"]
    assert message == CUT_MESSAGE
    # [DONE] where the route's streams end with it; the Responses API's events have no [DONE]
    assert events[1:] == ([] if path == "/v1/responses" else ["[DONE]"])


def test_another_cut_answer_is_ended_without_a_body():
    sent = run(app_cut_after([(b"content-type", b"application/json")], b'{"a":'), "/v1/models")
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_a_finished_answer_is_untouched():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b"data: [DONE]\r\n\r\n"})

    assert len(run(app, "/v1/completions")) == 2
    assert run(app_cut_after(SSE), "/v1/completions")[-1]["more_body"] is False


def probe(app) -> list[dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/readyz", "method": "GET", "headers": []}
    asyncio.run(StartingProbe(app)(scope, receive, send))
    return sent


def answering(status, body):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


def test_readyz_with_no_replica_to_route_to_is_starting():
    sent = probe(answering(404, b"Path '/readyz' not found. Ping http://.../-/routes"))
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"]) == {"status": "starting"}
    assert len(sent) == 2


def test_the_apps_own_readyz_answers_pass_untouched():
    for status, body in ((200, b'{"status":"ready"}'), (503, b'{"status":"starting"}')):
        sent = probe(answering(status, body))
        assert sent[0]["status"] == status and sent[1]["body"] == body


def through_rays_proxy(*request_ids: bytes) -> tuple[list[bytes], list[bytes]]:
    """The x-request-ids an app behind Ray's proxy middlewares is sent and the client gets."""
    from ray.serve._private.http_util import _apply_middlewares  # as Ray's proxy wraps its app

    seen = []

    async def app(scope, receive, send):
        seen.extend(v for n, v in scope["headers"] if n == b"x-request-id")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    headers = [(b"host", b"127.0.0.1"), *((b"x-request-id", rid) for rid in request_ids)]
    scope = {"type": "http", "path": "/v1/models", "method": "GET", "headers": headers}
    asyncio.run(_apply_middlewares(app, proxy_middlewares())(scope, receive, send))
    answered = [v for n, v in sent[0]["headers"] if n.lower() == b"x-request-id"]
    return seen, answered


@pytest.mark.parametrize(
    "request_ids",
    [(b"a" * 20_000,), (b"a" * 129,), (b"a b",), (b"id\x7f",), (b"\xe9t\xe9",), (b"",),
     (b"x" * 200, b"trace-1")],
)  # fmt: skip
def test_an_id_the_app_would_not_echo_is_replaced_by_rays_own(request_ids):
    seen, answered = through_rays_proxy(*request_ids)
    assert len(answered) == 1 and seen == answered  # one id, the one the replicas are told
    assert answered[0] not in request_ids and 0 < len(answered[0]) <= 128
    assert answered[0].decode().isprintable()


def test_a_clients_own_id_is_echoed_once():
    assert through_rays_proxy(b"trace-42.a") == ([b"trace-42.a"], [b"trace-42.a"])
    seen, answered = through_rays_proxy(b"trace-1", b"trace-2")  # the first, as Ray reads it
    assert seen == answered == [b"trace-1"]
