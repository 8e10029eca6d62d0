"""A generator that fails after its first output (a replica that died mid-stream) ends the
answer with an error event, then [DONE], on every streamed route, and is a JSON 500 when not streamed:
never a cut stream, never a traceback for the client."""

import json

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.engine.request import RequestOutput
from tests.serving.api.served import ACME, MODEL_ID, stub_settings

AUTH = {"Authorization": f"Bearer {ACME}"}
BODIES = {
    "/v1/chat/completions": {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL_ID, "prompt": "hi"},
    f"/ai/run/{MODEL_ID}": {"prompt": "hi"},
}


class DiesMidStream:
    """One token, then the exception a dead replica's stream raises."""

    async def generate(self, request, *, session=None):
        yield RequestOutput(request.request_id, (5,), "a", prompt_tokens=2, completion_tokens=1)
        raise RuntimeError("The actor died unexpectedly before finishing this task.\nTraceback")

    async def figures(self):
        return []

    async def ready(self):
        return True


@pytest.fixture
def client(world, tmp_path):
    app = create_app(DiesMidStream(), stub_settings(world, tmp_path))
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("path", list(BODIES))
def test_a_stream_that_breaks_ends_with_an_error_event(client, path):
    r = client.post(path, json={**BODIES[path], "stream": True}, headers=AUTH)
    assert r.status_code == 200  # sent with the first token
    events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"  # a finished stream, which no client retries as cut
    error = json.loads(events[-2])
    message = error["errors"][0]["message"] if path.startswith("/ai") else error["error"]["message"]
    assert "replica" in message and "Traceback" not in message and "actor" not in message
    assert any('"a"' in e for e in events[:-2])  # the token sent before the fault


def test_the_openai_client_reads_a_broken_stream_as_the_servers_error(client):
    """The openai package raises the error event as an APIError naming it, not a broken
    connection, after the token that came first."""
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url="http://testserver/v1", api_key=ACME, http_client=client,
                        max_retries=0)  # fmt: skip
    body = BODIES["/v1/chat/completions"]
    stream = api.chat.completions.create(**body, stream=True)
    got = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert not isinstance(raised.value, openai.APIConnectionError)
    assert "replica" in raised.value.message and "a" in got


@pytest.mark.parametrize("path", list(BODIES))
def test_a_collected_answer_that_breaks_is_a_json_500(client, path):
    r = client.post(path, json=BODIES[path], headers=AUTH)
    assert r.status_code == 500 and "Traceback" not in r.text
    body = r.json()
    message = body["errors"][0]["message"] if path.startswith("/ai") else body["error"]["message"]
    assert "retry" in message
