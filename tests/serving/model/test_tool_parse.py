"""Tool calls read out of a model's text: whole answers, the same text streamed in any
pieces, and text that is no call (kept as content). The expected calls are written by hand
in each family's documented spelling."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.model.tool_formats import HERMES, LLAMA3_JSON, MISTRAL, detect
from serving.model.tool_parse import (
    Arguments,
    CallOpened,
    CallReader,
    Content,
    ToolCall,
    parse_calls,
)

WEATHER = '{"city": "Pa\\"ris }", "days": [1, {"n": 2}]}'
HERMES_TEXT = (
    "Let me look.\n<tool_call>\n"
    f'{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
)
LLAMA_TEXT = (
    f'{{"name": "get_weather", "parameters": {WEATHER}}}; {{"name": "now", "parameters": {{}}}}'
)
MISTRAL_TEXT = (
    f'Checking. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER}}}, '
    '{"name": "now", "arguments": {}}]'
)
CALLS = [ToolCall("get_weather", WEATHER), ToolCall("now", "{}")]


def test_whole_answers_in_each_family():
    assert parse_calls(HERMES, HERMES_TEXT) == ("Let me look.", CALLS)
    assert parse_calls(LLAMA3_JSON, LLAMA_TEXT) == (None, CALLS)
    assert parse_calls(MISTRAL, MISTRAL_TEXT) == ("Checking.", CALLS)
    # an unconstrained model's spacing
    loose = '<tool_call>{ "name" : "now" ,"arguments":{"a": 1} }</tool_call>'
    assert parse_calls(HERMES, loose) == (None, [ToolCall("now", '{"a": 1}')])


def test_text_that_is_no_call_is_content():
    for text in [
        "plain text with < and <tool",
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}',  # cut off
        "<tool_call> not json </tool_call>",
        '<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>',  # not the family's order
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # arguments not an object
    ]:
        assert parse_calls(HERMES, text) == (text, []), text
    assert parse_calls(LLAMA3_JSON, "The answer is 4.") == ("The answer is 4.", [])
    for text in [
        '[TOOL_CALLS] [{"name": "f", "arguments": {}}',  # the list left open
        '[TOOL_CALLS] {"name": "f", "arguments": {}}',
    ]:  # no list
        assert parse_calls(MISTRAL, text) == (text, []), text


def streamed(fmt, pieces):
    reader, events = CallReader(fmt), []
    for piece in pieces:
        events += reader.feed(piece)
    events += reader.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    opened = [e for e in events if isinstance(e, CallOpened)]
    assert [e.index for e in opened] == list(range(len(opened)))
    args = ["".join(e.fragment for e in events if isinstance(e, Arguments) and e.index == k)
            for k in range(len(opened))]  # fmt: skip
    return content, [ToolCall(e.name, a) for e, a in zip(opened, args, strict=True)]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_split_of_a_stream_reads_as_the_whole(data):
    fmt, text = data.draw(st.sampled_from([(HERMES, HERMES_TEXT), (LLAMA3_JSON, LLAMA_TEXT),
                                           (MISTRAL, MISTRAL_TEXT)]))  # fmt: skip
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, calls = streamed(fmt, pieces)
    want_content, want_calls = parse_calls(fmt, text)
    assert calls == want_calls
    assert content.strip() == (want_content or "")
    for call in calls:
        json.loads(call.arguments)


def test_a_stream_never_shows_a_trigger_as_content():
    content, calls = streamed(
        HERMES, ["ok <tool", "_call>\n", '{"name": "now", ', '"arguments": {}}\n</tool_call>']
    )
    assert content == "ok " and calls == [ToolCall("now", "{}")]


def test_the_family_is_read_from_the_template():
    assert detect("{% if tools %}...<tool_call>{{ t | tojson }}</tool_call>{% endif %}") is HERMES
    llama = '{% if tools %}Respond as {"name": name, "parameters": dict}{% endif %}'
    assert detect(llama) is LLAMA3_JSON
    assert detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS] [") is MISTRAL
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect(None) is None
