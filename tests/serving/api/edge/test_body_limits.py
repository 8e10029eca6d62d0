"""BodyLimit as a bare ASGI middleware: refuses by Content-Length at once, counts chunks, and
replays a body within the limit unchanged."""

import asyncio
import json

import pytest

from adapters.format.base_model import BaseModelSpec
from serving.api.core.settings import upload_limit
from serving.api.edge.body_limits import BodyLimit


class App:
    """Reads the whole body, then answers with its length; notes whether it ran."""

    def __init__(self):
        self.called, self.body = False, b""

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(self.body)).encode()})


def call(chunks, *, path="/v1/completions", content_length=None, limit=10, upload=None):
    app = App()
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    received, sent = [], []

    async def receive():
        message = pending.pop(0) if pending else {"type": "http.disconnect"}
        received.append(message)
        return message

    async def send(message):
        sent.append(message)

    limiter = BodyLimit(app, max_body_bytes=limit, max_upload_bytes=upload)
    asyncio.run(limiter(scope, receive, send))
    return app, sent, len(received)


def test_a_declared_length_above_the_limit_is_refused_unread():
    app, sent, num_received = call([b"x" * 11], content_length=11)
    assert not app.called and num_received == 0
    assert sent[0]["status"] == 413
    body = json.loads(sent[1]["body"])
    assert body["error"]["type"] == "invalid_request_error"
    assert "larger than the limit" in body["error"]["message"]


@pytest.mark.parametrize("path", ["/ai/run/demo", "/v1/chat/completions"])
def test_chunks_are_counted_and_reading_stops_past_the_limit(path):
    app, sent, num_received = call([b"abcd", b"efgh", b"ijkl", b"mnop"], path=path)
    assert not app.called and num_received == 3  # the fourth chunk is never read
    body = json.loads(sent[1]["body"])
    if path.startswith("/ai/"):
        assert body["errors"][0]["code"] == 413 and body["success"] is False
    else:
        assert body["error"]["message"].startswith("the request body is larger")


def test_adapter_uploads_have_their_own_limit_sized_to_the_model():
    app, sent, _ = call([b"x" * 40], path="/v1/adapters", content_length=40, upload=50)
    assert app.called and sent[1]["body"] == b"40"  # above server.max_body_mb, within its own
    app, sent, _ = call([b"x" * 60], path="/v1/adapters", content_length=60, upload=50)
    message = json.loads(sent[1]["body"])["error"]["message"]
    assert not app.called and message.startswith("the adapter upload is larger than the limit")
    assert "lora.max_lora_rank" in message
    app, _, _ = call([b"x" * 40], content_length=40, upload=50)  # other routes: max_body_bytes
    assert not app.called


def test_an_upload_limit_holds_the_largest_valid_adapter():
    """A rank-64 Llama-3-8B adapter on every linear (671 MB in float32) fits its limit; the
    32 MiB default for other bodies would refuse even a rank-8 one in bfloat16 (42 MB)."""
    spec = BaseModelSpec.from_config({"hidden_size": 4096, "intermediate_size": 14336,
                                      "num_attention_heads": 32, "num_key_value_heads": 8,
                                      "num_hidden_layers": 32})  # fmt: skip
    fp32_rank64 = 32 * 64 * sum(i + o for i, o in spec.shapes.values()) * 4
    assert upload_limit(32 << 20, 64, spec, None) > fp32_rank64 > 600e6
    assert upload_limit(32 << 20, 1, BaseModelSpec(1, {"q_proj": (4, 4)}), None) == 32 << 20


def test_a_body_within_the_limit_reaches_the_app_whole():
    app, sent, _ = call([b"abc", b"def", b"ghij"], content_length=10)
    assert app.called and app.body == b"abcdefghij" and sent[1]["body"] == b"10"


def test_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BodyLimit(app, 1)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]
