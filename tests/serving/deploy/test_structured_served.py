"""Structured output through the served demo, as a user's client sees it.

The demo (configs/demo.yaml: its draft model speculating, its three adapters) serves 50
requests from the `openai` client, over the demo model and `demo:upper`, `demo:rot13` and
`demo:comment`, three schemas and JSON mode, streamed or not, chat and text completions, and
the Workers-AI route, all at once so that constrained and free rows share batches. Every
answer that completes parses as JSON and validates against its schema with `jsonschema`,
an independent validator; free-text requests in the same batches answer exactly what they
answer alone.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml
from openai import OpenAI

from tests.serving.deploy.served import free_port, serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
MODELS = ("demo", "demo:upper", "demo:rot13", "demo:comment")
MAX_TOKENS = 400  # ample: every schema bounds its strings, numbers and arrays

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}
LABEL = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["bug", "docs", "perf"]}, "maxItems": 3},
    },
    "required": ["label", "score", "tags"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "order": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "maxLength": 12},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["id", "items"],
            "additionalProperties": False,
        },
        "express": {"type": "boolean"},
    },
    "required": ["order", "express"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "label": LABEL, "order": ORDER}
PROMPT = "def read_config(path):\n"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured-served")
    config = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    config["model"]["path"] = str(ROOT / "models/demo/base")
    config["draft"]["path"] = str(ROOT / "models/demo/draft")
    config["lora"]["registry"] = str(root / "registry")
    config["lora"]["preload"] = {
        name: str(ROOT / "models/demo/adapters" / name) for name in ("upper", "rot13", "comment")
    }
    port = free_port()
    config["server"]["port"] = port
    config["batch"]["store"] = f"sqlite:///{root / 'batch.db'}"
    config["usage"]["store"] = f"sqlite:///{root / 'usage.db'}"
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with serving(path, port, root / "home") as served:
        yield served


def _format(kind: str) -> dict:
    if kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": kind, "schema": SCHEMAS[kind],
                                                   "strict": True}}  # fmt: skip


def _ask(url: str, i: int) -> tuple[str, str, str]:
    """Request i of the mix: (schema kind, finish reason, text)."""
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    kind = ("person", "label", "order", "json_object")[i % 4]
    model = MODELS[(i // 4) % len(MODELS)]
    extra = {"max_tokens": MAX_TOKENS, "response_format": _format(kind), "seed": i,
             "temperature": 0 if i % 3 else 0.8}  # fmt: skip
    how = i % 5
    if how == 4:  # the Workers-AI route, with its own shape of json_schema: the schema itself
        fmt = {"type": "json_object"} if kind == "json_object" else {
            "type": "json_schema", "json_schema": SCHEMAS[kind]}  # fmt: skip
        lora = model.partition(":")[2] or None
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                "response_format": fmt, **({"lora": lora} if lora else {})}  # fmt: skip
        answer = httpx.post(f"{url}/ai/run/demo", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        text = answer.json()["result"]["response"]
        return kind, "stop" if _parses(text) else "length", text
    if how in (0, 1):
        messages = [{"role": "user", "content": f"Describe item {i} as JSON."}]
        if how == 0:
            out = client.chat.completions.create(model=model, messages=messages, **extra)
            return kind, out.choices[0].finish_reason, out.choices[0].message.content
        parts, reason = [], None
        for chunk in client.chat.completions.create(
            model=model, messages=messages, stream=True, **extra
        ):
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                reason = chunk.choices[0].finish_reason or reason
        return kind, reason, "".join(parts)
    # The client's completions.create has no response_format parameter: it goes in the body.
    extra["extra_body"] = {"response_format": extra.pop("response_format")}
    if how == 2:
        out = client.completions.create(model=model, prompt=PROMPT, **extra)
        return kind, out.choices[0].finish_reason, out.choices[0].text
    parts, reason = [], None
    for chunk in client.completions.create(model=model, prompt=PROMPT, stream=True, **extra):
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
    return kind, reason, "".join(parts)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _free(url: str, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["text"]


def test_fifty_mixed_requests_answer_valid_json(url):
    alone = {model: _free(url, model) for model in MODELS}
    with ThreadPoolExecutor(8) as pool:
        constrained = [pool.submit(_ask, url, i) for i in range(50)]
        beside = [pool.submit(_free, url, m) for m in MODELS for _ in range(2)]
        results = [f.result() for f in constrained]
        free = [f.result() for f in beside]
    completed = {kind: 0 for kind in (*SCHEMAS, "json_object")}
    for kind, reason, text in results:
        if reason != "stop":
            continue
        completed[kind] += 1
        value = json.loads(text)  # strict: no raw control characters, nothing after the value
        if kind == "json_object":
            assert isinstance(value, dict), text
        else:
            jsonschema.validate(value, SCHEMAS[kind])
    # Each schema bounds its output, so all of them complete. JSON mode bounds nothing: a
    # model that never closes a string runs to max_tokens (finish_reason "length").
    asked = {kind: sum(k == kind for k, _, _ in results) for kind in completed}
    assert {k: completed[k] for k in SCHEMAS} == {k: asked[k] for k in SCHEMAS}, results
    assert completed["json_object"] >= 1, results
    assert free == [alone[m] for m in MODELS for _ in range(2)]


def test_each_answer_is_named_by_one_request_id(url):
    """The replica's app names answers with x-request-id (a client's own echoed), and
    nothing on the way adds another, so a client sees one id, not "id, id"."""
    mine = httpx.get(f"{url}/v1/models", headers={"x-request-id": "trace-7"}, timeout=30)
    assert mine.headers.get_list("x-request-id") == ["trace-7"]
    fresh = httpx.get(f"{url}/v1/models", timeout=30)
    assert len(fresh.headers.get_list("x-request-id")) == 1
