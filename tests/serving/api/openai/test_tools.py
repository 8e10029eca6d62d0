"""Tool calling through the official `openai` client, against a model whose chat template
offers tools in the Hermes spelling (tool_world.py).

Oracles: the function's own schema (`jsonschema`) for every call's arguments; the chat
template rendered directly (with transformers' message shapes) for the prompt a history
with calls makes; the plain rows of a mixed batch against the same request run alone.
"""

import json
import threading

import jsonschema
import openai
import pytest

from tests.serving.api.openai.tool_world import tool_world
from tests.serving.api.served import ACME, serve

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Oslo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}  # fmt: skip
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]}}}  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FIXED = {"temperature": 0, "max_tokens": 160}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    world = tool_world(tmp_path_factory.mktemp("tools-world"))
    with serve(world, tmp_path_factory.mktemp("tools"), max_model_len=512) as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0)


def valid_calls(calls, names=SCHEMAS):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("model", ["demo", "demo:upper"])
def test_required_answers_valid_calls(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False, **FIXED)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    valid_calls(choice.message.tool_calls)


def test_a_named_function_is_the_one_called(client):
    for name in SCHEMAS:
        r = client.chat.completions.create(
            model="demo:rot13", messages=ASK, tools=TOOLS, **FIXED,
            tool_choice={"type": "function", "function": {"name": name}},
        )  # fmt: skip
        assert r.choices[0].finish_reason == "tool_calls"
        calls = r.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == [name]
        valid_calls(calls)


def test_a_stream_sends_calls_as_openai_does(client):
    kwargs = dict(model="demo:upper", messages=ASK, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, **FIXED)  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    deltas, reasons = [], []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            reasons.append(choice.finish_reason)
            assert not choice.delta.content  # calls only: no text beside them
    first, rest = deltas[0], deltas[1:]
    # a call opens with its index, id, type and name, its arguments empty; then only pieces
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == whole[0].function.name and first.function.arguments == ""
    assert rest and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    assert "".join(d.function.arguments for d in rest) == whole[0].function.arguments
    assert [r for r in reasons if r] == ["tool_calls"]


def test_a_history_with_calls_renders_as_the_template_does(client, served):
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    r = client.chat.completions.create(model="demo", messages=history, tools=TOOLS, max_tokens=3)
    # as transformers' callers pass them: arguments an object, tools as sent
    turns = [dict(history[0]), {**history[1], "content": "", "tool_calls": [
        {**history[1]["tool_calls"][0], "function": {"name": "get_weather",
                                                    "arguments": {"city": "Paris", "days": 2}}}]},
        history[2]]  # fmt: skip
    text = served.world.tokenizer.apply_chat_template(turns, tools=TOOLS)
    assert "<tool_response>sunny</tool_response>" in text and '"days": 2' in text
    ids = served.world.tokenizer.encode(text, add_special_tokens=False)
    assert r.usage.prompt_tokens == len(ids)


def test_auto_answers_text_or_calls(client):
    r = client.chat.completions.create(model="demo:rot13", messages=ASK, tools=TOOLS, **FIXED)
    choice = r.choices[0]
    if choice.message.tool_calls:
        valid_calls(choice.message.tool_calls)
        assert choice.finish_reason == "tool_calls"
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_tool_choice_none_answers_as_without_tools(client):
    plain = client.chat.completions.create(model="demo", messages=ASK, **FIXED)
    r = client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                       tool_choice="none", **FIXED)  # fmt: skip
    assert r.choices[0].message.tool_calls is None
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens  # the tools were in the prompt


def test_tool_rows_share_a_batch_with_plain_rows(client, served):
    """A plain row's tokens are the ones it gets alone while constrained rows share its steps."""
    ids = served.chat_ids([{"role": "user", "content": "hello there"}])
    want, _ = served.reference(ids, "rot13", 40)
    results = {}

    def call(key, **kw):
        results[key] = client.chat.completions.create(messages=ASK if key != "plain" else [
            {"role": "user", "content": "hello there"}], **kw)  # fmt: skip

    threads = [threading.Thread(target=call, args=(f"t{i}",), kwargs=dict(
        model=m, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **FIXED))
        for i, m in
        enumerate(["demo:upper", "demo", "demo:upper"])]  # fmt: skip
    threads.append(threading.Thread(target=call, args=("plain",), kwargs=dict(
        model="demo:rot13", temperature=0, max_tokens=40)))  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plain = results["plain"]
    assert plain.usage.completion_tokens == len(want)
    assert plain.choices[0].message.content == served.world.tokenizer.decode(want)
    for key in ("t0", "t1", "t2"):
        valid_calls(results[key].choices[0].message.tool_calls)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
        ({"tools": None, "tool_choice": "required"}, "needs tools"),
        ({"response_format": {"type": "json_object"}}, "response_format and tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "1-64 characters"),
        ({"tools": [{"type": "retrieval"}]}, "function"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "twice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "format": "madeup"}}}}}]},
         "format"),
        ({"functions": [{"name": "f"}]}, "use tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "f", "arguments": "{not json"}}]}]}, "arguments"),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": "<|user|>"}}]},
         "special tokens"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(client, change, words):
    kwargs = {"model": "demo", "messages": ASK, "tools": TOOLS, "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{k: v for k, v in kwargs.items() if v is not None})
    assert words in err.value.body["message"], err.value.body


def test_a_model_without_a_tool_format_names_the_config_key(world, tmp_path):
    """The API world's template writes no calls: tools are refused, and the key named."""
    with serve(world, tmp_path) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key=ACME, max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="demo", messages=ASK, tools=TOOLS, max_tokens=2)
        assert "model.tool_call_format" in err.value.body["message"]
        ok = c.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                       tool_choice="none", max_tokens=2)  # fmt: skip
        assert ok.choices[0].message.tool_calls is None


def test_completions_refuse_tools(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt="x", max_tokens=2,
                                  extra_body={"tools": TOOLS})  # fmt: skip
    assert "/v1/chat/completions" in err.value.body["message"]


RESPONSES_TOOLS = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]


def test_responses_answer_function_call_items(client):
    r = client.responses.create(model="demo:upper", input="Weather in Paris?", tools=RESPONSES_TOOLS,
                                tool_choice="required", parallel_tool_calls=False,
                                temperature=0, max_output_tokens=160)  # fmt: skip
    assert r.status == "completed" and r.tool_choice == "required"
    [call] = [item for item in r.output if item.type == "function_call"]
    assert call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    # the answer goes back as input, with the call's output: the next turn reads both
    follow = client.responses.create(
        model="demo:upper", tools=RESPONSES_TOOLS, max_output_tokens=3,
        input=[{"role": "user", "content": "Weather in Paris?"}, call.model_dump(),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )  # fmt: skip
    assert follow.status in ("completed", "incomplete")


def test_a_responses_stream_sends_call_events(client):
    kwargs = dict(model="demo", input="Weather?", tools=RESPONSES_TOOLS, temperature=0,
                  tool_choice={"type": "function", "name": "add"}, max_output_tokens=160)  # fmt: skip
    whole = client.responses.create(**kwargs)
    [want] = [item for item in whole.output if item.type == "function_call"]
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[2].item.type == "function_call" and events[2].item.name == "add"
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(pieces) == done.arguments == want.arguments
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.arguments == want.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_the_config_key_names_the_format_a_template_does_not(world, tmp_path):
    """model.tool_call_format set: a template that writes no calls still gets them read and
    constrained in that family's spelling."""
    with serve(world, tmp_path, max_model_len=512, tool_call_format="llama3_json") as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key=ACME, max_retries=0)
        r = c.chat.completions.create(model="demo", messages=ASK, tools=TOOLS, **FIXED,
                                      tool_choice="required", parallel_tool_calls=False)  # fmt: skip
        assert r.choices[0].finish_reason == "tool_calls"
        valid_calls(r.choices[0].message.tool_calls)


def test_auto_without_tools_is_a_plain_answer(client):
    """tool_choice "auto" with no tools (a client's default) answers as if it were absent."""
    r = client.chat.completions.create(model="demo", messages=ASK, tool_choice="auto", max_tokens=2)
    assert r.choices[0].message.tool_calls is None
    rr = client.responses.create(model="demo", input="hi", tool_choice="auto", max_output_tokens=2)
    assert not [item for item in rr.output if item.type == "function_call"]
