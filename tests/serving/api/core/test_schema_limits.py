"""check_schema's refusals of what xgrammar compiles too slowly or does not enforce: a
pattern's huge counted repeats, a length bound beside pattern or format (dropped by the
compiler), and a number range holding no number the grammar can write (an empty grammar, so
an empty answer). Each 400 names the keyword's JSON pointer. The schemas it accepts at the
edges of these rules are enforced: every random walk through their compiled grammar ends in
JSON that jsonschema (formats checked) accepts.
"""

import datetime
import json
import random
import re
import time

import jsonschema
import pydantic
import pytest
import torch

from serving.api.core.schema_patterns import MAX_PATTERN_REPEAT
from serving.api.core.schema_rules import check_schema
from serving.engine.grammar.compiler import GrammarCompiler, GrammarError
from serving.engine.grammar.formats import PATTERNS
from serving.engine.grammar.matcher import RowGrammar
from serving.engine.request import ResponseFormat
from tests.serving.engine.world import FIELDS

REFUSED = [  # (schema, the pointer named, words the 400 must hold)
    ({"type": "string", "pattern": "^[a-z]{1,30100}$"}, "/pattern", "more than 1000 times"),
    ({"type": "string", "pattern": "^[a-z]{1001}$"}, "/pattern", "more than 1000"),
    ({"type": "string", "pattern": "^a{1001,}$"}, "/pattern", "more than 1000"),
    ({"type": "string", "pattern": "^([a-z]{1,50}){1,50}$"}, "/pattern", "nested counts multiply"),
    ({"type": "string", "pattern": "^(x|(?:y{2,40}){0,30})$"}, "/pattern", "more than 1000"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=b{2000})"}}},
     "/properties/a/pattern", "more than 1000"),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}, "/maxLength", "beside pattern"),
    ({"type": "string", "pattern": "^a$", "minLength": 3}, "/minLength", "beside pattern"),
    ({"type": "string", "format": "uuid", "maxLength": 5}, "/maxLength", "beside format"),
    ({"type": "string", "format": "email", "maxLength": 12}, "/maxLength", "beside format"),
    ({"type": "object", "propertyNames": {"pattern": "^k", "maxLength": 3}},
     "/propertyNames/maxLength", "beside pattern"),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-300},
     "/exclusiveMaximum", "no number of at most 6 decimals"),
    ({"type": "number", "minimum": 0.1234561, "maximum": 0.1234569},
     "/maximum", "no number of at most 6 decimals"),
    ({"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.500001},
     "/exclusiveMaximum", "no number"),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
     "/exclusiveMaximum", "no integer"),
    ({"type": "integer", "minimum": 3, "maximum": 2}, "/maximum", "no integer"),
    ({"type": "integer", "minimum": 0.5}, "/minimum", "whole number"),
    ({"type": "number", "minimum": float("nan"), "maximum": 1}, "/minimum", "finite number"),
    ({"type": "integer", "maximum": float("inf")}, "/maximum", "finite number"),
    ({"type": "array", "items": {"type": "integer", "exclusiveMaximum": 2.5}},
     "/items/exclusiveMaximum", "whole number"),
    # dropped or misread by xgrammar: an answer could break the pattern
    ({"type": "string", "pattern": "^(?!a)a$"}, "/pattern", "negative lookahead"),
    ({"type": "string", "pattern": "^(?=[0-9])[a-z0-9]$"}, "/pattern", "lookahead"),
    ({"type": "string", "pattern": "(?<=a)b"}, "/pattern", "lookbehind"),
    ({"type": "string", "pattern": "^x^y$"}, "/pattern", "^ only at the start"),
    ({"type": "string", "pattern": "^(a$)+$"}, "/pattern", "$ only at the end"),
    ({"type": "string", "pattern": "a$b"}, "/pattern", "$ only at the end"),
    ({"type": "string", "pattern": "\\bword"}, "/pattern", "\\b"),
    ({"type": "string", "pattern": "\\Aabc\\Z"}, "/pattern", "\\A"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "/pattern", "backreference"),
    ({"type": "object", "patternProperties": {"^k(?!x)": {"type": "integer"}}},
     "/patternProperties/^k(?!x)", "lookahead"),
    ({"type": "integer", "multipleOf": 1025}, "/multipleOf", "above 1024"),
    ({"type": "string", "format": "date", "pattern": "^2"}, "/format", "give format or pattern"),
    # that no answer meets: the compiler refuses them, but only once the request runs
    ({"type": "array", "minItems": 3, "maxItems": 1}, "/maxItems", "at least 3 and at most 1"),
    ({"type": "string", "minLength": 5, "maxLength": 2.0}, "/maxLength", "at least 5 and at most 2"),
    ({"type": "object", "minProperties": 2, "maxProperties": 1}, "/maxProperties",
     "at least 2 and at most 1"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False, "minItems": 2},
     "/minItems", "at least 2 and at most 1"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False,
      "minProperties": 2}, "/minProperties", "at least 2 and at most 1"),
    ({"enum": []}, "/enum", "an empty enum"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "/required",
     "'a' is required, but its schema is false"),
]  # fmt: skip
ACCEPTED = [  # at the edges of the rules above; each is walked below
    {"type": "string", "pattern": "^[a-z]{1,4}$"},
    {"type": "string", "pattern": "^([a-c]{1,2}-){1,3}$"},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2.0, "maxItems": 2},  # 2.0 is 2
    {"type": "string", "format": "uuid"},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.000002},
    {"type": "number", "minimum": 0.5, "maximum": 0.5},
    {"type": "number", "minimum": -1.5, "maximum": -0.25},
    {"type": "number", "minimum": 0.1234567, "maximum": 0.1234579},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 2},
    {"type": "integer", "minimum": -3, "maximum": 1e1},
    {"type": "string", "pattern": "^a$|^b$"},  # anchors at each end of a branch
    {"type": "string", "pattern": "(?:^a|b)c$"},
    {"type": "integer", "multipleOf": 1024, "minimum": 1, "maximum": 5000},
    # optional groups with a repeat inside, which xgrammar would write without their first
    # character unless spelt {0,1} (serving.engine.grammar.formats)
    {"type": "string", "pattern": "^a(-[0-9]{1,3})?$"},
    {"type": "string", "pattern": "^[0-9]{1,3}(?:\\.[0-9]{1,6})?Z$"},
    {"type": "string", "pattern": "^((a|b)(x[0-9]{1,2})?)+$"},
    {"type": "string", "format": "date"},  # the checker reads the calendar: 02-30 fails it
    {"type": ["string", "null"], "format": "date"},
]
WALKS, MAX_STEPS = 12, 120


@pytest.mark.parametrize(("schema", "pointer", "words"), REFUSED, ids=[r[1] for r in REFUSED])
def test_what_xgrammar_cannot_compile_or_enforce_is_refused(schema, pointer, words):
    with pytest.raises(ValueError) as caught:
        check_schema(schema)
    message = str(caught.value)
    assert f" at {pointer} is not supported: " in message and words in message, message


REPRO = {"type": "object",  # 1,942 bytes: each pattern alone is allowed, not their sum
         "properties": {f"p{i}": {"type": "string", "pattern": "^.{1,1000}$"} for i in range(40)}}  # fmt: skip


COSTLY = [
        (REPRO, "/properties/p0/pattern"),
        ({"type": "string", "pattern": "^" + "(ab|.{1,9})" * 2900 + "$"}, "/pattern"),  # 31.9 KB
        ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1200)}},
         "/properties"),  # optional properties: 2,000 take minutes
        ({"type": "string", "pattern": "^(.{1,100}){1,10}$"}, "/pattern"),  # nested: 21 s
        ({"type": "object", "properties": {"a": {"type": "string"}, "words": {
            "type": "string", "pattern": "^(\\w{1,20} ?){1,50}$"}}}, "/properties/words/pattern"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "pointer"),
    COSTLY,
    ids=["many-repeats", "32k-pattern", "optional-properties", "nested", "nested-narrow"],
)
def test_a_schema_too_costly_to_compile_is_refused_at_once(schema, pointer, monkeypatch):
    """The estimate, not a compile, refuses it: in milliseconds, naming the costliest part."""
    monkeypatch.setattr(GrammarCompiler, "_schema", lambda *a: pytest.fail("compiled"))
    began = time.process_time()
    with pytest.raises(ValueError) as caught:
        check_schema(schema)
    assert time.process_time() - began < 2.0  # the compile would take minutes to hours
    message = str(caught.value)
    assert "more than the 2 s allowed" in message and f"at {pointer} (about" in message, message


def test_realistic_schemas_are_within_the_budget():
    """Tool calls, a 50-property object and the bench's schemas pass the estimate."""
    from bench.structured_workload import SCHEMAS

    fifty = {"type": "object", "properties": {f"property_{i}": {"type": "string"} for i in range(50)}}  # fmt: skip
    tool = {"type": "object", "properties": {
        "name": {"enum": ["get_weather", "search", "send_email"]},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 100}, "unit": {"enum": ["c", "f"]},
            "query": {"type": "string", "pattern": "^[^|]{1,200}$"},
            "to": {"type": "string", "pattern": "^[a-z0-9.]{1,64}@[a-z0-9.]{1,64}$"}},
            "required": ["city"]}}, "required": ["name", "arguments"]}  # fmt: skip
    for schema in (fifty, tool, *SCHEMAS.values()):
        check_schema(schema)


def test_the_engine_refuses_what_the_api_does(world):
    compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"])
    with pytest.raises(GrammarError, match="/properties/p0/pattern"):
        compiler.compile_now(ResponseFormat("json_schema", json.dumps(REPRO), strict=True))
    assert compiler.pids() == []  # refused before any process started
    compiler.shutdown()


def test_strict_reaches_the_estimate_from_the_api_and_the_engine(world):
    """300 properties compile in about a second strict, several times that not strict (a
    rule per prefix of the names): the same schema passes with strict, is refused without,
    as OpenAI's wrapper sends it and as the engine takes it."""
    from serving.api.core.response_format import OpenAIResponseFormat

    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}  # fmt: skip
    body = lambda strict: {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": strict}}  # fmt: skip  # noqa: E731
    assert OpenAIResponseFormat.model_validate(body(True)).engine_format().strict
    with pytest.raises(pydantic.ValidationError, match="more than the 2 s allowed"):
        OpenAIResponseFormat.model_validate(body(False))
    compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"])
    try:
        text = json.dumps(schema)
        assert compiler._schema(ResponseFormat("json_schema", text, strict=True))[1] is True
        with pytest.raises(GrammarError, match="more than the 2 s allowed"):
            compiler._schema(ResponseFormat("json_schema", text, strict=False))
    finally:
        compiler.shutdown()


def test_the_repeat_bound_is_inclusive():
    check_schema({"type": "string", "pattern": f"^[a-z]{{1,{MAX_PATTERN_REPEAT}}}$"})
    check_schema({"type": "string", "pattern": "^([a-z0-9]{1,63}\\.){1,10}[a-z]{2,6}$"})
    check_schema({"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"})
    check_schema({"type": "string", "maxLength": 10**6})  # counted by xgrammar: 1 ms


@pytest.fixture(scope="module")
def compiler(world):
    compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"], time_limit_s=60.0)
    yield compiler
    compiler.shutdown()  # its compile processes end with it


def walk(compiler, grammar: RowGrammar, rng: random.Random) -> str | None:
    """The text of one random walk through grammar to its end; None if it runs on."""
    stops, tokens = set(compiler._tokenizer.eos_token_ids), []
    mask = grammar.allocate(1)
    for _ in range(MAX_STEPS):
        grammar.fill(mask, 0)
        bits = (mask[0].unsqueeze(-1) >> torch.arange(32, dtype=mask.dtype)) & 1
        allowed = bits.flatten()[: grammar.vocab_size].nonzero().flatten().tolist()
        assert allowed, "the grammar allows no token: it can produce no answer"
        token = rng.choice(allowed)
        assert grammar.accept(token)
        if grammar.terminated:
            assert token in stops
            return compiler._tokenizer.decode(tokens)
        tokens.append(token)
    return None


def ended_walks(compiler, schema: dict, seed: int) -> list[str]:
    """The texts of the WALKS random walks through schema's compiled grammar that end."""
    compiled = compiler.compile_now(ResponseFormat("json_schema", json.dumps(schema), strict=True))
    rng = random.Random(seed)
    texts = [walk(compiler, RowGrammar(compiled), rng) for _ in range(WALKS)]
    ended = [t for t in texts if t is not None]
    assert ended, "no walk ended"
    return ended


@pytest.mark.parametrize("schema", ACCEPTED, ids=[json.dumps(s) for s in ACCEPTED])
def test_what_is_accepted_is_enforced(compiler, schema):
    check_schema(schema)
    for text in ended_walks(compiler, schema, 0):
        jsonschema.validate(
            json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )


class Event(pydantic.BaseModel):
    """A model as instructor or LangChain turns into a response_format."""

    name: str
    day: datetime.date
    at: datetime.datetime
    until: datetime.date | None


def test_pydantic_dates_are_served_and_every_answer_parses_back(compiler):
    """Reference: pydantic reads each walk's answer back into the model (dates checked by
    the calendar, datetimes with their offsets), and Python reads each date-time."""
    for text in ended_walks(compiler, check_schema(Event.model_json_schema()), 1):
        event = Event.model_validate_json(text)
        assert event.at.tzinfo is not None
        at = json.loads(text)["at"]  # Python's re, not the compiler, reads it as RFC 3339
        assert re.fullmatch(PATTERNS["date-time"], at), at
        assert datetime.datetime.fromisoformat(at) == event.at
