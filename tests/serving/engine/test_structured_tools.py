"""Tool-call constraints end to end: rows held to a family's call syntax (structural tags,
serving/model/tool_formats.py) beside free rows and under adapters.

The oracles are independent of the engine's grammar code: each call is cut out of the text
with plain string operations and the family's documented spelling, its arguments read with
`json.loads` and checked with `jsonschema.validate` against the function's schema. Free rows
sharing the batch get exactly the tokens they get alone.
"""

import json

import jsonschema
import pytest
import xgrammar

from serving.engine.request import ResponseFormat
from serving.model.tool_formats import HERMES, LLAMA3_JSON, MISTRAL, structural_tag
from tests.serving.engine.test_structured import compiled, params, req, run
from tests.serving.engine.world import build_world

WEATHER = {"type": "object", "required": ["city", "days"], "additionalProperties": False,
           "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}  # fmt: skip
ADD = {"type": "object", "required": ["a", "b"], "additionalProperties": False,
       "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2, "x"]}}}  # fmt: skip
FUNCTIONS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [(name, schema, False) for name, schema in FUNCTIONS.items()]


def tool_format(fmt, choice, parallel=False) -> ResponseFormat:
    return ResponseFormat(
        "structural_tag", json.dumps(structural_tag(fmt, TOOLS, choice, parallel))
    )


def calls_of(fmt, text: str) -> list[tuple[str, dict]]:
    """The calls of an answer that is calls only, cut by the family's spelling."""
    out = []
    if fmt is MISTRAL:  # one JSON list after the marker
        assert text.startswith("[TOOL_CALLS]"), text
        return [(c["name"], c["arguments"]) for c in json.loads(text.removeprefix("[TOOL_CALLS]"))]
    if fmt is HERMES:
        *pieces, rest = text.split("</tool_call>")
        assert rest == "" and all(p.strip().startswith("<tool_call>") for p in pieces), text
        pieces = [p.strip().removeprefix("<tool_call>") for p in pieces]
    else:
        pieces = text.split("; ")
    for piece in pieces:
        call = json.loads(piece)
        assert set(call) == {"name", fmt.args_key}, call
        out.append((call["name"], call[fmt.args_key]))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("structured-tools"))


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON, MISTRAL], ids=lambda f: f.name)
def test_required_and_named_rows_are_valid_calls_and_free_rows_untouched(world, engines, fmt):
    choices = ["required", "add", "get_weather", "required"]
    names = ["upper", "rot13", None, "mlp"]
    constrained = [
        req(world, f"t{i}", range(30 + i, 40 + 2 * i), params(i, 200), names[i],
            tool_format(fmt, choice))
        for i, choice in enumerate(choices)
    ]  # fmt: skip
    free = [req(world, f"f{i}", range(60 + i, 70 + i), params(i, 24, ignore_eos=True),
                ["rot13", None][i % 2]) for i in range(3)]  # fmt: skip
    engine = engines()
    for r in constrained:  # compiled first, so the free rows share their steps
        engine.grammars.compiler.compile_now(r.response_format)
    got = run(engine, constrained + free)
    for r, choice in zip(constrained, choices, strict=True):
        text = got.text(r.request_id, world.tokenizer)
        assert got.done[r.request_id].finish_reason == "stop", (r.request_id, text)
        calls = calls_of(fmt, text)
        assert len(calls) == 1  # parallel_tool_calls off
        name, arguments = calls[0]
        assert name == choice if choice != "required" else name in FUNCTIONS
        jsonschema.validate(arguments, FUNCTIONS[name])
    alone = run(engines(), free)
    for r in free:
        assert got.tokens[r.request_id] == alone.tokens[r.request_id], r.request_id


def test_parallel_calls_each_validate(world, engines):
    """With parallel calls on, a required row may call again after a separator; every whole
    call validates, and a cut answer's whole calls do too."""
    f = tool_format(HERMES, "required", parallel=True)
    requests = [req(world, f"p{i}", (5, 6, 7, i), params(i, 240), "upper", f) for i in range(4)]
    got = run(engines(), requests)
    for r in requests:
        text = got.text(r.request_id, world.tokenizer)
        whole = text if got.done[r.request_id].finish_reason == "stop" else (
            text[: text.rfind("</tool_call>") + len("</tool_call>")])  # fmt: skip
        if whole:
            for name, arguments in calls_of(HERMES, whole):
                jsonschema.validate(arguments, FUNCTIONS[name])


def test_auto_rows_write_free_text_until_they_open_a_call(world, engines):
    """Under auto the text is the model's own until it opens a call: a free row of the same
    prompt, adapter and seed writes the same tokens up to the first one that a fresh
    matcher of the grammar refuses (special tokens, bytes that are no UTF-8)."""
    f = tool_format(HERMES, "auto")
    auto = [req(world, f"a{i}", (9, 8, 7, i), params(i, 40), "rot13", f) for i in range(4)]
    free = [req(world, f"a{i}", (9, 8, 7, i), params(i, 40), "rot13") for i in range(4)]
    got_auto, got_free = run(engines(), auto), run(engines(), free)
    grammar = compiled(world.tokenizer, f)
    same = 0
    for r in auto:
        want = got_free.tokens[r.request_id]
        assert "<tool_call>" not in got_free.text(r.request_id, world.tokenizer)
        matcher = xgrammar.GrammarMatcher(grammar)
        cut = next((k for k, t in enumerate(want) if not matcher.accept_token(t)), len(want))
        assert got_auto.tokens[r.request_id][:cut] == want[:cut], r.request_id
        same += cut
    assert same >= 20  # the rows really ran free for a while
