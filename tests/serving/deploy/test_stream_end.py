"""The proxy middleware: an answer whose app returned mid-body (its replica died) is ended,
an event stream with an error event in its route's style; finished answers pass untouched."""

import asyncio
import json

import pytest

from serving.deploy.stream_end import CUT_MESSAGE, EndCutStreams, StartingProbe

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


@pytest.mark.parametrize("path", ["/v1/completions", "/ai/run/demo"])
def test_a_cut_event_stream_ends_with_an_error_event(path):
    sent = run(app_cut_after(SSE, b'data: {"x": 1}\r\n\r\n'), path)
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last["more_body"]
    event = json.loads(last["body"].decode().removeprefix("data: "))
    message = event["errors"][0]["message"] if path.startswith("/ai") else event["error"]["message"]
    assert message == CUT_MESSAGE


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
