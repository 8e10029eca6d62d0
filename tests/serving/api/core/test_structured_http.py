"""Constrained output over HTTP from the tiny world's real engine, read by the `openai` client.

The output validates with `jsonschema`; log-probabilities of a constrained answer list only
tokens its grammar allowed (a masked token's -inf is no JSON number); a stream cut by
max_tokens ends "length" with text that is no complete JSON value yet.
"""

from __future__ import annotations

import datetime
import json
import math

import jsonschema
import openai
import pydantic
import pytest

from tests.serving.api.served import ACME, MODEL_ID, serve

LABEL = {
    "type": "object",
    "properties": {"label": {"enum": ["yes", "no", "unsure"]}, "n": {"type": "integer",
                   "minimum": 0, "maximum": 9}},
    "required": ["label", "n"],
    "additionalProperties": False,
}  # fmt: skip
FORMAT = {"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL, "strict": True}}
MESSAGES = [{"role": "user", "content": "Is it raining?"}]


@pytest.fixture(scope="module")
def client(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("structured-http")) as served:
        yield openai.OpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0)


@pytest.mark.parametrize("model", [MODEL_ID, "upper"])
def test_chat_answer_validates_and_its_logprobs_are_numbers(client, model):
    out = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=40, temperature=0,
        logprobs=True, top_logprobs=5,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), LABEL)
    assert list(json.loads(choice.message.content)) == ["label", "n"]  # the schema's order
    entries = choice.logprobs.content
    assert entries and all(math.isfinite(e.logprob) for e in entries)
    tops = [t.logprob for e in entries for t in e.top_logprobs]
    assert all(math.isfinite(v) for v in tops)
    # where the grammar allows one token only (inside the enum's word), it is the only one
    assert any(len(e.top_logprobs) == 1 for e in entries)


def test_a_stream_cut_by_max_tokens_ends_length_with_a_json_prefix(client):
    parts, reason = [], None
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, response_format=FORMAT, max_tokens=3, stream=True,
        temperature=0,
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            reason = chunk.choices[0].finish_reason or reason
    text = "".join(parts)
    assert reason == "length"
    assert text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize("temperature", [0, 1])
def test_a_schema_no_string_satisfies_is_the_callers_400_not_a_500(client, temperature):
    """The pattern's empty class compiles, but after the opening quote no token is allowed."""
    empty = {"type": "json_schema",
             "json_schema": {"name": "none", "schema": {"type": "string", "pattern": "^[^\\s\\S]$"}}}  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="allows no next token") as caught:
        client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, response_format=empty, max_tokens=5,
            temperature=temperature, seed=1,
        )  # fmt: skip
    assert caught.value.status_code == 400
    # the server goes on serving
    ok = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, response_format=FORMAT, max_tokens=40, temperature=0
    )
    jsonschema.validate(json.loads(ok.choices[0].message.content), LABEL)


class Meeting(pydantic.BaseModel):
    """Dates, as instructor and the openai client's parse() send them (format date-time)."""

    title: str = pydantic.Field(max_length=8)
    day: datetime.date
    starts: datetime.datetime


def test_the_openai_clients_parse_fills_a_model_with_dates(client):
    out = client.beta.chat.completions.parse(
        model=MODEL_ID, messages=MESSAGES, response_format=Meeting, max_tokens=200, temperature=0
    )
    meeting = out.choices[0].message.parsed
    assert isinstance(meeting, Meeting) and meeting.starts.tzinfo is not None
