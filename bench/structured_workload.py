"""What the structured-output benchmarks ask for: the JSON schemas, as the API passes them to
the engine, and the chat prompts (bench/structured.py, structured_libraries.py, gpu_structured.py)."""

from __future__ import annotations

import json

from serving.api.core.schema_rules import canonical, check_schema
from serving.engine.request import ResponseFormat
from serving.model.tool_formats import HERMES, structural_tag


def string(min_length: int, max_length: int) -> dict:
    return {"type": "string", "minLength": min_length, "maxLength": max_length}


def obj(properties: dict) -> dict:
    """A closed object whose properties are all required."""
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}  # fmt: skip


# The decode table's schema: long strings (minLength keeps a model that would close a string
# at once writing), so a constrained run is mostly decode steps.
RECORD = obj({"title": string(30, 50), "author": string(10, 30), "summary": string(30, 50),
              "keywords": {"type": "array", "items": string(5, 20), "minItems": 3,
                           "maxItems": 3}})  # fmt: skip
NESTED = obj({"name": {"type": "string", "maxLength": 40},
              "age": {"type": "integer", "minimum": 0, "maximum": 150},
              "tags": {"type": "array", "maxItems": 3,
                       "items": {"type": "string", "enum": ["alpha", "beta", "gamma"]}},
              "address": obj({"city": {"type": "string", "maxLength": 30},
                              "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"}})})  # fmt: skip
# A tool call: one of four functions, each with its own arguments
TOOLS = {"anyOf": [
    obj({"name": {"const": "get_weather"},
         "arguments": obj({"city": string(1, 60), "unit": {"enum": ["celsius", "fahrenheit"]},
                           "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})}),
    obj({"name": {"const": "search"},
         "arguments": obj({"query": string(1, 200), "limit": {"type": "integer", "minimum": 1,
                                                              "maximum": 50},
                           "sites": {"type": "array", "items": {"type": "string",
                                                                "format": "uri"}}})}),
    obj({"name": {"const": "send_email"},
         "arguments": obj({"to": {"type": "string", "format": "email"}, "subject": string(1, 120),
                           "body": {"type": "string"}, "cc": {"type": "array",
                                    "items": {"type": "string", "format": "email"}}})}),
    obj({"name": {"const": "create_event"},
         "arguments": obj({"title": string(1, 80), "start": {"type": "string", "format": "time"},
                           "minutes": {"type": "number", "minimum": 0},
                           "attendees": {"type": "array", "items": obj({
                               "email": {"type": "string", "format": "email"},
                               "optional": {"type": "boolean"}})}})}),
]}  # fmt: skip
SCHEMAS = {"record": RECORD, "nested": NESTED, "tools": TOOLS}
MODULES = ["os.path", "json", "textwrap", "shlex", "collections", "itertools", "pathlib", "re"]


def response_format(schema: dict | None) -> ResponseFormat:
    """What the API passes the engine: json_schema (strict) when given one, else json_object."""
    if schema is None:
        return ResponseFormat("json_object")
    return ResponseFormat("json_schema", canonical(check_schema(schema)), strict=True)


def prompts(tok) -> list[list[int]]:
    """Chat prompts asking for a record of a standard-library module."""
    asks = [f"Describe the module {m} as JSON: title, author, summary, keywords." for m in MODULES]
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": a}])) for a in asks]


# The tool-call rows' functions: TOOLS' four, each its arguments' schema, offered as a chat
# request's tools and called in the demo template's <tool_call> spelling
FUNCTIONS = {one["properties"]["name"]["const"]: one["properties"]["arguments"]
             for one in TOOLS["anyOf"]}  # fmt: skip
OFFERED = [{"type": "function", "function": {"name": n, "parameters": s}}
           for n, s in FUNCTIONS.items()]  # fmt: skip


def tool_call_format() -> ResponseFormat:
    """What the chat route passes the engine for tool_choice "required", one call."""
    functions = [(n, canonical(check_schema(s)), False) for n, s in FUNCTIONS.items()]
    tag = structural_tag(HERMES, [(n, json.loads(s), strict) for n, s, strict in functions],
                         "required", False)  # fmt: skip
    return ResponseFormat("structural_tag", json.dumps(tag))


def tool_prompts(tok) -> list[list[int]]:
    """Chat prompts that offer FUNCTIONS and ask for one of them."""
    asks = [f"Find the documentation of {m}, then email it to me." for m in MODULES]
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": a}], tools=OFFERED))
            for a in asks]  # fmt: skip
