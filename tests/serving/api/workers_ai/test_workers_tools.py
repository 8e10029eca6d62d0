"""Workers AI's function calling on /ai/run: `tools` in its own shape (or OpenAI's), answered
as Workers AI answers them, `tool_calls` of {name, arguments (an object)}; streamed, the text
goes out as it comes and the calls whole with the last event."""

import json

import cloudflare
import httpx
import jsonschema
import pytest

from tests.serving.api.openai.test_tools import SCHEMAS
from tests.serving.api.openai.tool_world import tool_world
from tests.serving.api.served import ACME, MODEL_ID, serve
from tests.serving.api.workers_ai.test_routes_workers_ai import sse_data

AUTH = {"Authorization": f"Bearer {ACME}"}
# Workers AI's own shape: the function's fields, with no wrapper
TOOLS = [{"name": n, "description": f"the {n} tool", "parameters": s} for n, s in SCHEMAS.items()]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    world = tool_world(tmp_path_factory.mktemp("workers-tools-world"))
    with serve(world, tmp_path_factory.mktemp("workers-tools"), max_model_len=512) as s:
        yield s


def run(served, body, **kw):
    return httpx.post(f"{served.url}/ai/run/{MODEL_ID}", json=body, headers=AUTH, timeout=60, **kw)


def answers(result: dict) -> list[dict]:
    """The calls of a result, each checked against its function's schema; text or calls."""
    calls = result.get("tool_calls") or []
    for call in calls:
        assert set(call) == {"name", "arguments"}
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    assert calls or result["response"]
    return calls


@pytest.mark.parametrize("lora", [None, "upper"])
def test_tools_answer_text_or_valid_calls(served, lora):
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS,
            "temperature": 0, "max_tokens": 160, **({"lora": lora} if lora else {})}  # fmt: skip
    r = run(served, body)
    assert r.status_code == 200, r.text
    answers(r.json()["result"])


def test_the_prompt_holds_the_tools_in_either_shape(served):
    wrapped = [{"type": "function", "function": t} for t in TOOLS]
    base = {"prompt": "Weather?", "max_tokens": 2, "temperature": 0}
    usage = [run(served, {**base, "tools": t}).json()["result"]["usage"]["prompt_tokens"]
             for t in (TOOLS, wrapped, None)]  # fmt: skip
    assert usage[0] == usage[1] > usage[2]


def test_a_stream_ends_with_the_calls(served):
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "temperature": 0, "max_tokens": 160, "stream": True}  # fmt: skip
    whole = run(served, {**body, "stream": False}).json()["result"]
    events = [json.loads(d) for d in sse_data(run(served, body).text) if d != "[DONE]"]
    assert "tool_calls" in events[-1] and all("tool_calls" not in e for e in events[:-1])
    assert events[-1]["tool_calls"] == whole["tool_calls"]
    assert "".join(e["response"] for e in events) == (whole["response"] or "")


def test_a_tool_turn_by_name_reads_as_workers_ai_sends_it(served):
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "tool", "name": "get_weather", "content": "sunny"}]  # fmt: skip
    r = run(served, {"messages": messages, "tools": TOOLS, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tools": [{"name": "bad name"}]}, "tools: 0.name: a function's name"),
        ({"tools": [{"type": "retrieval"}]}, "tools: 0.type"),
        ({"raw": True, "prompt": "x", "messages": None}, "leave out raw"),
    ],
)
def test_refusals_name_the_field(served, change, words):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, **change}
    r = run(served, {k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400 and words in r.text, r.text


def test_cloudflares_sdk_sends_tools_and_reads_the_calls(served):
    client = cloudflare.Cloudflare(api_token=ACME, base_url=served.url, max_retries=0)
    result = client.ai.run(MODEL_ID, account_id="acme", tools=TOOLS, temperature=0,
                           messages=[{"role": "user", "content": "Weather in Oslo?"}],
                           max_tokens=160, lora="upper")  # fmt: skip
    direct = run(served, {"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                          "tools": TOOLS, "temperature": 0, "max_tokens": 160,
                          "lora": "upper"}).json()["result"]  # fmt: skip
    assert answers(result) == answers(direct)
    assert result["response"] == direct["response"]
