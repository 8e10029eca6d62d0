"""response_format: both shapes become the engine's ResponseFormat with the schema as canonical
text, and a schema the engine would not enforce whole is a 400 naming why, on every route
and for a queued item at submission, before any request reaches the engine."""

import json
import time

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from serving.api import create_app
from serving.api.core.response_format import OpenAIResponseFormat, WorkersResponseFormat
from serving.api.core.schema_rules import MAX_SCHEMA_BYTES, check_schema
from serving.engine.request import ResponseFormat
from tests.serving.api.core.test_cache_salt import Recorder
from tests.serving.api.served import ACME, MODEL_ID, stub_settings

AUTH = {"Authorization": f"Bearer {ACME}"}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# keys keep their order: the grammar writes properties in the schema's order
CANONICAL = (
    '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer",'
    '"minimum":0}},"required":["name","age"],"additionalProperties":false}'
)
TURN = [{"role": "user", "content": "hi"}]
BIG = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}
BAD = [  # (schema, words the 400 must hold)
    ({"type": "objekt"}, ["not a valid JSON schema", "/type", "objekt"]),
    (
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
        ["uniqueItems", "/properties/tags/uniqueItems", "not enforced"],
    ),
    (BIG, ["bytes", str(MAX_SCHEMA_BYTES)]),
    ([{"type": "string"}], ["must be a JSON object", "array"]),
]
BAD_IDS = ["invalid", "unsupported", "huge", "not-an-object"]


def openai_format(schema, strict=None) -> dict:
    spec = {"name": "person", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def routes(response_format_openai: dict, response_format_workers: dict) -> list:
    return [
        ("/v1/chat/completions", {"model": MODEL_ID, "messages": TURN,
                                  "response_format": response_format_openai}),
        ("/v1/completions", {"model": MODEL_ID, "prompt": "hi",
                             "response_format": response_format_openai}),
        (f"/ai/run/{MODEL_ID}", {"prompt": "hi", "response_format": response_format_workers}),
    ]  # fmt: skip


def message(response) -> str:
    body = response.json()
    return body["errors"][0]["message"] if "errors" in body else body["error"]["message"]


@pytest.fixture
def app(world, tmp_path):
    recorder = Recorder()
    with TestClient(create_app(recorder, stub_settings(world, tmp_path))) as client:
        yield client, recorder


def test_the_openai_shape_becomes_canonical_text_and_keeps_strict():
    field = OpenAIResponseFormat.model_validate(openai_format(SCHEMA, strict=True))
    assert field.engine_format() == ResponseFormat("json_schema", CANONICAL, True)
    field = OpenAIResponseFormat.model_validate(openai_format(SCHEMA))
    assert field.engine_format() == ResponseFormat("json_schema", CANONICAL, False)


def test_the_workers_shape_takes_the_schema_itself_or_the_openai_wrapper():
    bare = WorkersResponseFormat.model_validate({"type": "json_schema", "json_schema": SCHEMA})
    assert bare.engine_format() == ResponseFormat("json_schema", CANONICAL, False)
    wrapped = WorkersResponseFormat.model_validate(openai_format(SCHEMA, strict=True))
    assert wrapped.engine_format() == ResponseFormat("json_schema", CANONICAL, True)
    with pytest.raises(ValidationError, match="name must be"):
        WorkersResponseFormat.model_validate(
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}
        )


@pytest.mark.parametrize("cls", [OpenAIResponseFormat, WorkersResponseFormat])
def test_json_object_and_text(cls):
    assert cls.model_validate({"type": "json_object"}).engine_format() == ResponseFormat(
        "json_object"
    )
    assert cls.model_validate({"type": "text"}).engine_format() is None
    with pytest.raises(ValidationError, match="needs json_schema"):
        cls.model_validate({"type": "json_schema"})
    with pytest.raises(ValidationError, match="goes with"):
        cls.model_validate({**openai_format(SCHEMA), "type": "json_object"})


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"minLength": 2}, ["minLength", "/minLength", '"type": "string"']),
        ({"type": "array", "contains": {"const": 1}}, ["contains", "/contains", "not enforced"]),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, ["oneOf", "use anyOf"]),
        ({"type": "string", "format": "ipv4"}, ["format", "'ipv4'"]),
        ({"pattern": "^a+$"}, ["/pattern", '"type": "string"']),
        ({"type": "integer", "enum": [1, 5], "minimum": 3}, ["enum", "minimum"]),
        ({"type": "string", "enum": ["a", 1]}, ["/enum", "1 is not of its type"]),
        ({"properties": {"a": {}}, "required": ["b"]}, ["/required", "'b'"]),
        ({"$ref": "https://example.com/s.json"}, ["/$ref", "JSON pointer"]),
        ({"$defs": {}, "$ref": "#/$defs/x"}, ["/$ref", "names nothing"]),
        ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, ["/allOf", "one schema"]),
        ({"type": "string", "pattern": '^a"b$'}, ["/pattern"]),
        ({"type": "number", "multipleOf": 0.5}, ["/multipleOf"]),
        ({"type": "object", "x-extra": 1}, ["x-extra", "not enforced"]),
        ({"type": "string", "description": "\ud800"}, ["lone surrogate"]),
    ],
)
def test_keywords_the_grammar_would_drop_are_refused(schema, words):
    with pytest.raises(ValueError) as caught:
        check_schema(schema)
    for word in words:
        assert word in str(caught.value)


def test_what_the_grammar_enforces_passes():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "order",
        "$defs": {"id": {"type": "string", "pattern": "^[a-z0-9-]+$", "description": "an id"}},
        "type": "object",
        "properties": {
            "id": {"$ref": "#/$defs/id"},
            "at": {"type": "string", "format": "time"},
            "note": {"type": ["string", "null"], "minLength": 1, "maxLength": 80},
            "n": {"type": "integer", "minimum": 1, "maximum": 9, "multipleOf": 3},
            "kind": {"enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
            "x": {"anyOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 0}]},
        },
        "required": ["id", "n"],
        "additionalProperties": False,
    }
    assert check_schema(schema) is schema


def test_depth_is_limited():
    deep: dict = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match=r"nests \d+ levels deep"):
        check_schema(deep)


@pytest.mark.parametrize(("schema", "words"), BAD, ids=BAD_IDS)
def test_every_route_refuses_a_bad_schema_before_the_engine(app, schema, words):
    client, recorder = app
    for path, body in routes(openai_format(schema), {"type": "json_schema", "json_schema": schema}):
        r = client.post(path, json=body, headers=AUTH)
        assert r.status_code == 400, (path, r.text)
        assert "response_format.json_schema" in message(r), path
        for word in words:
            assert word in message(r), (path, message(r))
    assert recorder.requests == []


def test_a_valid_format_reaches_the_engine_on_every_route(app):
    client, recorder = app
    wanted = ResponseFormat("json_schema", CANONICAL, True)
    for path, body in routes(openai_format(SCHEMA, True), openai_format(SCHEMA, True)):
        r = client.post(path, json=body, headers=AUTH)
        assert r.status_code == 200, (path, r.text)
    bare = {"type": "json_schema", "json_schema": SCHEMA}
    r = client.post(f"/ai/run/{MODEL_ID}", json={"prompt": "hi", "response_format": bare},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 200, r.text
    mode = {"type": "json_object"}
    for path, body in routes(mode, mode):
        assert client.post(path, json=body, headers=AUTH).status_code == 200
    got = [request.response_format for request in recorder.requests]
    bare_format, json_mode = ResponseFormat("json_schema", CANONICAL), ResponseFormat("json_object")
    assert got == [wanted] * 3 + [bare_format] + [json_mode] * 3


def test_a_queued_item_with_a_bad_schema_is_refused_at_submission(app):
    client, recorder = app
    bad = {"type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}}
    items = [{"prompt": "fine"}, {"prompt": "bad", "response_format": bad}]
    r = client.post(f"/ai/run/{MODEL_ID}?queueRequest=true", json={"requests": items},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 400
    assert "requests.1.response_format.json_schema" in message(r)
    assert "/uniqueItems" in message(r)
    top = {"requests": [{"prompt": "x"}], "response_format": {"type": "json_object"}}
    r = client.post(f"/ai/run/{MODEL_ID}?queueRequest=true", json=top, headers=AUTH)
    assert r.status_code == 400 and "set it in each item" in message(r)
    assert recorder.requests == []


def test_a_queued_item_keeps_its_format_when_it_runs(app):
    client, recorder = app
    fmt = {"type": "json_schema", "json_schema": SCHEMA}
    r = client.post(f"/ai/run/{MODEL_ID}?queueRequest=true",
                    json={"requests": [{"prompt": "hi", "response_format": fmt}]},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 200, r.text
    request_id = r.json()["result"]["request_id"]
    deadline = time.monotonic() + 30
    while not recorder.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    poll = client.post(f"/ai/run/{MODEL_ID}", json={"request_id": request_id}, headers=AUTH)
    assert poll.status_code == 200, poll.text
    assert [q.response_format for q in recorder.requests] == [
        ResponseFormat("json_schema", CANONICAL, False)
    ]
    assert json.loads(recorder.requests[0].response_format.schema) == SCHEMA
