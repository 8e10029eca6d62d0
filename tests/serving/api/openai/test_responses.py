"""POST /v1/responses through the `openai` client: the answer equals the engine run alone on
the chat the input makes, streamed or not; earlier output read back as input; text.format
constrains the output (the client's parse() fills a model); what is not served is a 400."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pydantic
import pytest

from tests.serving.api.served import ACME, MAX_MODEL_LEN, MODEL_ID

AUTH = {"Authorization": f"Bearer {ACME}"}


def _expected(served, messages: list[dict], adapter: str | None, max_tokens: int):
    """(text, status) of the request run alone, greedy, on the reference engine."""
    tokens, text = served.reference(served.chat_ids(messages), adapter, max_tokens)
    return text, "incomplete" if len(tokens) == max_tokens else "completed"


@pytest.mark.parametrize("model, adapter", [(MODEL_ID, None), ("upper", "upper")])
def test_a_response_equals_the_engine_alone(served, client, model, adapter):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want, status = _expected(served, messages, adapter, 6)
    out = client.responses.create(
        model=model, input="hi", instructions="be brief", max_output_tokens=6, temperature=0
    )
    assert out.object == "response" and out.id.startswith("resp_") and out.model == model
    assert out.output_text == want and out.status == status
    [message] = out.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].text == want
    if status == "incomplete":
        assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.input_tokens == len(served.chat_ids(messages))
    assert out.usage.output_tokens <= 6
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.store is False and out.instructions == "be brief"
    assert out.usage.input_tokens_details.cache_write_tokens == 0  # the SDK requires it


def test_a_streamed_response_gives_the_same_text_and_ordered_events(served, client):
    messages = [{"role": "user", "content": "hello there"}]
    want, status = _expected(served, messages, "rot13", 8)
    kinds, deltas = [], []
    with client.responses.stream(
        model="rot13", input="hello there", max_output_tokens=8, temperature=0
    ) as stream:
        for event in stream:
            kinds.append((event.type, event.sequence_number))
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        # the closing event's response (the client's get_final_response() reads only a
        # response.completed, and max_output_tokens may end this one incomplete)
        final = event.response
    assert "".join(deltas) == want == final.output_text
    assert final.status == status and final.usage.output_tokens <= 8
    assert [n for _, n in kinds] == list(range(len(kinds)))
    names = [k for k, _ in kinds]
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]  # fmt: skip
    tail = ["response.output_text.done", "response.content_part.done",
            "response.output_item.done", f"response.{status}"]  # fmt: skip
    assert names[:4] == head and names[-4:] == tail
    assert set(names[4:-4]) <= {"response.output_text.delta"}


def test_an_earlier_output_is_read_back_as_a_turn(served, client):
    first = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=4, temperature=0)
    follow = [{"role": "user", "content": "hi"}, *first.output,
              {"role": "user", "content": [{"type": "input_text", "text": "more"}]}]  # fmt: skip
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "more"}]  # fmt: skip
    want, _ = _expected(served, messages, None, 5)
    out = client.responses.create(model=MODEL_ID, input=follow, max_output_tokens=5, temperature=0)
    assert out.output_text == want
    assert out.usage.input_tokens == len(served.chat_ids(messages))


class Label(pydantic.BaseModel):
    label: Literal["yes", "no", "unsure"]
    n: int = pydantic.Field(ge=0, le=9)


def test_text_format_constrains_the_output_and_parse_fills_the_model(client):
    out = client.responses.parse(
        model="upper", input="Is it raining?", text_format=Label, max_output_tokens=40,
        temperature=0,
    )  # fmt: skip
    assert out.status == "completed"
    assert isinstance(out.output_parsed, Label)
    assert out.text.format.type == "json_schema" and out.text.format.name == "Label"


def test_logprobs_are_included_when_asked(client):
    out = client.responses.create(
        model="upper", input="hi", max_output_tokens=4, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )  # fmt: skip
    entries = out.output[0].content[0].logprobs
    assert len(entries) == out.usage.output_tokens
    # the tokens' bytes make the text (a token may hold part of a character)
    assert b"".join(bytes(e.bytes) for e in entries).decode(errors="replace") == out.output_text
    for e in entries:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token and e.logprob <= 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id: responses are not stored"),
        ({"max_output_tokens": 0}, "max_output_tokens must be at least 1"),
        ({"max_output_tokens": -100}, "max_output_tokens must be at least 1"),
        ({"background": True}, "background responses are not supported"),
        ({"n": 2}, "a response has one output"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]: only function tools are served"),
        ({"prompt_logprobs": 0}, "prompt_logprobs: not served on /v1/responses"),
        ({"echo": True}, "echo: not served on /v1/responses"),
        ({"tools": [{"type": "function", "name": "f"}], "text": {"format": {"type": "json_object"}}},
         "text.format and tools cannot constrain one answer together: leave text.format out"),
        ({"include": ["file_search_call.results"]}, "'file_search_call.results' is not supported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]: only text is supported, not 'input_image'"),
        ({"input": [{"type": "reasoning", "summary": []}]},
         "input[0]: items of type 'reasoning' are not supported"),
        ({"input": [{"type": "function_call_output", "output": "1"}]},
         "input[0]: a tool message needs tool_call_id"),
        ({"input": []}, "input: needs at least one turn"),
        ({"input": [{"role": "user", "content": "\ud800"}]}, "input[0].content: the text holds"),
        ({"response_format": {"type": "json_object"}}, "use text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a name and a schema"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
            "type": "string", "pattern": "(?=a)"}}}}, "a lookahead or lookbehind cannot be"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_400_naming_it(served, body, message):
    body = {"model": MODEL_ID, "input": "hi", "max_output_tokens": 2, **body}
    # json.dumps escapes a lone surrogate (as a client may send it); httpx's json= cannot
    r = httpx.post(served.url + "/v1/responses", content=json.dumps(body), timeout=60,
                   headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"include": ["x"]}, "include"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"temperature": 9}, "temperature"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ],
)  # fmt: skip
def test_a_400_names_its_field_once_and_as_param(served, body, param):
    r = httpx.post(served.url + "/v1/responses", headers=AUTH, timeout=60,
                   json={"model": MODEL_ID, "input": "hi", **body})  # fmt: skip
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param, r.text
    assert error["message"].count(param) == 1, r.text  # not "include: include: ..."


def _long_turns(words: int) -> list[dict]:
    """Old turns that together overflow the context, then a short question."""
    old = [{"role": r, "content": " ".join(["apple"] * words)} for r in ("user", "assistant")] * 3
    return [{"role": "system", "content": "be brief"}, *old, {"role": "user", "content": "hi"}]


def test_truncation_auto_drops_the_oldest_turns_until_the_input_fits(served, client):
    turns = _long_turns(words=6)
    assert len(served.chat_ids(turns)) >= MAX_MODEL_LEN
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model=MODEL_ID, input=turns[1:], instructions="be brief",
                                max_output_tokens=3)  # fmt: skip
    # the reference: the system turn and the newest turns that leave room for output
    kept = next(turns[:1] + turns[k:] for k in range(2, len(turns))
                if len(served.chat_ids(turns[:1] + turns[k:])) < MAX_MODEL_LEN)  # fmt: skip
    assert len(kept) > 2  # some old turns stay
    want, _ = _expected(served, kept, None, 3)
    out = client.responses.create(model=MODEL_ID, input=turns[1:], instructions="be brief",
                                  max_output_tokens=3, temperature=0, truncation="auto")  # fmt: skip
    assert out.output_text == want and out.truncation == "auto"
    assert out.usage.input_tokens == len(served.chat_ids(kept))


def test_truncation_auto_keeps_the_last_turn_whole(served):
    body = {
        "model": MODEL_ID,
        "truncation": "auto",
        "max_output_tokens": 2,
        "input": [{"role": "user", "content": "x"}, {"role": "user", "content": "y " * 200}],
    }
    r = httpx.post(served.url + "/v1/responses", headers=AUTH, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_an_unknown_model_is_a_404(served):
    r = httpx.post(served.url + "/v1/responses", headers=AUTH, timeout=60,
                   json={"model": "nope", "input": "hi"})  # fmt: skip
    assert r.status_code == 404, r.text


# A pattern whose last class is empty: after the quote and 16 letters the grammar allows no
# token. The letters come first so the stream has begun (its first output sent) when the
# request fails, however many steps the engine runs before the route reads it.
NOTHING = {"type": "json_schema", "name": "none",
           "schema": {"type": "string", "pattern": "^abcdefghijklmnop[^\\s\\S]$"}}  # fmt: skip


def test_a_request_failing_midway_is_a_400_or_ends_its_stream_failed(client):
    kwargs = dict(model=MODEL_ID, input="hi", text={"format": NOTHING}, max_output_tokens=40,
                  temperature=0)  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="allows no next token"):
        client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas.startswith('"a')  # the text sent before the dead end
    assert "allows no next token" in events[-2].message
    failed = events[-1].response
    assert failed.status == "failed" and "allows no next token" in failed.error.message
    assert failed.error.code == events[-2].code == "invalid_prompt"  # OpenAI's code for input
    # the server goes on serving
    assert client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2).output_text
