"""POST /ai/run/{model}: prompt, messages, raw, lora and SSE streams, against the engine alone."""

import json

import httpx
import pytest

from tests.serving.api.served import ACME, MODEL_ID

AUTH = {"Authorization": f"Bearer {ACME}"}


def run(served, body, model=MODEL_ID):
    return httpx.post(f"{served.url}/ai/run/{model}", json=body, headers=AUTH, timeout=30)


def sse_data(text: str) -> list[str]:
    return [line[len("data:") :].strip() for line in text.splitlines() if line.startswith("data:")]


@pytest.mark.parametrize(
    ("lora", "adapter"),
    [("upper", "upper"), (f"{MODEL_ID}:rot13", "rot13"), (None, None)],
)
def test_prompt_goes_through_the_chat_template(served, lora, adapter):
    ids = served.chat_ids([{"role": "user", "content": "what is up"}])
    _, want = served.reference(ids, adapter, 5)
    body = {"prompt": "what is up", "max_tokens": 5, "temperature": 0}
    r = run(served, {**body, **({"lora": lora} if lora else {})})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["success"] is True and answer["errors"] == [] and answer["messages"] == []
    assert answer["result"]["response"] == want
    usage = answer["result"]["usage"]
    assert usage["prompt_tokens"] == len(ids) and usage["cached_tokens"] >= 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_raw_skips_the_template(served):
    _, want = served.reference(served.text_ids("what is up"), "mlp", 5)
    r = run(served, {"prompt": "what is up", "raw": True, "lora": "mlp", "max_tokens": 5,
                     "temperature": 0})  # fmt: skip
    assert r.json()["result"]["response"] == want
    assert r.json()["result"]["usage"]["prompt_tokens"] == len(served.text_ids("what is up"))


def test_messages_and_a_pinned_version(served):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]  # fmt: skip
    _, want = served.reference(served.chat_ids(messages), "upper", 4)
    version = served.world.versions["upper"]  # name@digest, as the registry stores it
    r = run(served, {"messages": messages, "lora": version, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["result"]["response"] == want


def test_stream_is_sse_ending_with_done(served):
    ids = served.chat_ids([{"role": "user", "content": "stream it"}])
    _, want = served.reference(ids, "rot13", 6)
    body = {"prompt": "stream it", "lora": "rot13", "stream": True, "max_tokens": 6,
            "temperature": 0}  # fmt: skip
    r = run(served, body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert "".join(e["response"] for e in events) == want
    assert events[-1]["usage"]["prompt_tokens"] == len(ids)
    assert all("usage" not in e for e in events[:-1])


def test_the_path_must_name_the_served_model(served):
    r = run(served, {"prompt": "x"}, model="@cf/meta/llama-3-8b")
    assert r.status_code == 404
    assert r.json()["success"] is False and "demo" in r.json()["errors"][0]["message"]


def test_a_lora_for_another_base_is_404(served):
    r = run(served, {"prompt": "x", "lora": "other-model:upper"})
    assert r.status_code == 404 and r.json()["errors"][0]["code"] == 404


@pytest.mark.parametrize(
    "content_type", [None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"]
)
def test_a_body_sent_as_cloudflares_examples_send_it_is_read_as_json(served, content_type):
    """curl -d (form-urlencoded), fetch() with a string (text/plain) or no type at all: the
    body is the request's JSON, as Workers AI reads it; the answer is the JSON-typed one's."""
    body = {"prompt": "what is up", "max_tokens": 4, "temperature": 0}
    want = run(served, body).json()["result"]["response"]
    headers = {**AUTH, **({"content-type": content_type} if content_type else {})}
    r = httpx.post(f"{served.url}/ai/run/{MODEL_ID}", content=json.dumps(body).encode(),
                   headers=headers, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["result"]["response"] == want
    multipart = httpx.post(f"{served.url}/ai/run/{MODEL_ID}", files={"f": b"x"}, headers=AUTH)
    assert multipart.status_code == 400


def test_workers_ais_own_ranges_are_served(served):
    """temperature up to 5 and top_p up to 2, as Workers AI documents them; a top_p over 1
    cuts nothing, so a seeded draw equals top_p 1's."""
    body = {"prompt": "what is up", "max_tokens": 4, "seed": 7}
    hot = run(served, {**body, "temperature": 5})
    assert hot.status_code == 200, hot.text
    wide = run(served, {**body, "temperature": 1, "top_p": 1.8}).json()["result"]["response"]
    assert wide == run(served, {**body, "temperature": 1}).json()["result"]["response"]
