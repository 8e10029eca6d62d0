"""The event loop stays free: a huge prompt is refused by its character cap before any
tokenizing, and tokenizing and chat templates run in worker threads."""

import json
import threading
import time

import httpx
import pytest

from serving.api.core.prompts import MAX_CHARS_PER_TOKEN
from tests.serving.api.served import ACME, MAX_MODEL_LEN, MODEL_ID, serve

AUTH = {"Authorization": f"Bearer {ACME}", "content-type": "application/json"}
HUGE = 30_000_000  # characters: past the cap, within the body limit raised below


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("loop"), max_body_bytes=64 << 20) as s:
        yield s


def huge_bodies():
    text = "the quick brown fox " * (HUGE // 20)
    turn = {"role": "user", "content": text}
    return {
        "completion": ("/v1/completions", {"model": MODEL_ID, "prompt": text}),
        "chat": ("/v1/chat/completions", {"model": MODEL_ID, "messages": [turn]}),
        "workers-ai": (f"/ai/run/{MODEL_ID}", {"prompt": text, "raw": True}),
        "workers-ai-templated": (f"/ai/run/{MODEL_ID}", {"prompt": text}),
        "workers-ai-chat": (f"/ai/run/{MODEL_ID}", {"messages": [turn]}),
    }


@pytest.mark.parametrize(
    "route", ["completion", "chat", "workers-ai", "workers-ai-templated", "workers-ai-chat"]
)
def test_healthz_answers_while_a_30mb_prompt_is_refused(served, route):
    path, body = huge_bodies()[route]
    r, latencies = answered_while_probing(served, path, body)
    assert r.status_code == 400, r.text[:300]
    limit = MAX_MODEL_LEN * MAX_CHARS_PER_TOKEN
    field = "messages" if "chat" in route else "prompt"
    assert "This model's maximum context length is" in r.text
    assert f"the {field} holds {HUGE} characters, more than the limit of {limit}" in r.text
    # Parsing the 30 MB JSON body itself takes the loop for up to ~0.5 s on a loaded 2-core
    # host; tokenizing or templating it there would take it for many seconds.
    assert max(latencies) < 1.5, latencies


def test_prompts_within_the_cap_are_tokenized_and_served(served):
    text = "word " * 20
    body = {"model": MODEL_ID, "prompt": text, "max_tokens": 2, "temperature": 0}
    r = httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len(served.text_ids(text))


def answered_while_probing(served, path: str, body: dict) -> tuple[httpx.Response, list[float]]:
    """The answer to body on path, and /healthz's latencies while it was on its way."""
    content = json.dumps(body).encode()
    answer = {}

    def send():
        answer["r"] = httpx.post(served.url + path, content=content, headers=AUTH, timeout=120)

    sender = threading.Thread(target=send)
    sender.start()
    latencies = []
    with httpx.Client(timeout=30) as probe:
        while sender.is_alive():
            t0 = time.perf_counter()
            assert probe.get(served.url + "/healthz").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)
    sender.join()
    return answer["r"], latencies


@pytest.mark.parametrize("route", ["completion", "chat", "workers-ai-chat"])
def test_a_slow_tokenizer_leaves_the_loop_free(served, monkeypatch, route):
    tokenizer = served.settings.tokenizer
    encode, render = tokenizer.encode, tokenizer.apply_chat_template

    def slow(fn):
        def wrapped(*args, **kwargs):
            time.sleep(0.8)  # a long prompt on a slow tokenizer, held in a worker thread
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(tokenizer, "encode", slow(encode))
    monkeypatch.setattr(tokenizer, "apply_chat_template", slow(render))
    turn = {"role": "user", "content": "hi"}
    path, body = {
        "completion": ("/v1/completions", {"model": MODEL_ID, "prompt": "hi"}),
        "chat": ("/v1/chat/completions", {"model": MODEL_ID, "messages": [turn]}),
        "workers-ai-chat": (f"/ai/run/{MODEL_ID}", {"messages": [turn]}),
    }[route]
    r, latencies = answered_while_probing(served, path, {**body, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert len(latencies) > 3 and max(latencies) < 0.5, latencies
