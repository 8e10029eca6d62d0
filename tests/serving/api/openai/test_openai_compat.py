"""OpenAI-compatibility edges, through the `openai` client and raw bodies: null fields take
their defaults, fields that would change the answer and are not served are refused, a model
card is fetched by id, and OpenAI's newer shapes (the developer role) are read as it reads them."""

import httpx
import openai
import pytest

from tests.serving.api.served import ACME, MODEL_ID

AUTH = {"Authorization": f"Bearer {ACME}"}
CHAT = [{"role": "user", "content": "hello there"}]


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, headers=AUTH, timeout=60)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": MODEL_ID, "prompt": "hi", "n": None, "stream": None,
                             "echo": None, "logprobs": None, "best_of": None, "suffix": None}),
        ("/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "n": None,
                                  "stream": None, "logprobs": None, "logit_bias": None,
                                  "stream_options": None, "tools": None}),
        (f"/ai/run/{MODEL_ID}", {"prompt": "hi", "raw": None, "stream": None, "lora": None}),
    ],
    ids=["completions", "chat", "workers-ai"],
)  # fmt: skip
def test_a_null_field_takes_its_default(served, path, body):
    body = {**body, "max_tokens": 3, "temperature": 0}
    without_nulls = {k: v for k, v in body.items() if v is not None}
    r, plain = post(served, path, body), post(served, path, without_nulls)
    assert r.status_code == 200, r.text
    assert answer_of(r.json()) == answer_of(plain.json())


def answer_of(body):
    """body less what differs between two equal requests: ids, times, prefix-cache hits."""
    if isinstance(body, dict):
        drop = {"id", "created", "cached_tokens", "prompt_tokens_details"}
        return {k: answer_of(v) for k, v in body.items() if k not in drop}
    return [answer_of(v) for v in body] if isinstance(body, list) else body


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "suffix", "\n}"),
        ("/v1/completions", "best_of", 2),
        ("/v1/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("/v1/completions", "tool_choice", "required"),
        ("/v1/chat/completions", "functions", [{"name": "f"}]),
        ("/v1/chat/completions", "function_call", "auto"),
        ("/v1/completions", "suffix", "none"),  # each field's own "off", not another's
        ("/v1/completions", "tools", "none"),
        ("/v1/completions", "best_of", {}),
    ],
)
def test_a_field_that_would_change_the_answer_and_is_not_served_is_refused(
    served, path, field, value
):
    body = {"model": MODEL_ID, "max_tokens": 2, field: value}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": CHAT})
    r = post(served, path, body)
    assert r.status_code == 400, r.text
    assert f"{field} is not supported" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_options_without_a_stream_are_refused(served, path):
    body = {"model": MODEL_ID, "max_tokens": 2, "stream_options": {"include_usage": True}}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": CHAT})
    r = post(served, path, body)
    assert r.status_code == 400, r.text
    assert "stream_options is only allowed with stream: true" in r.json()["error"]["message"]
    assert post(served, path, {**body, "stream": True}).status_code == 200


def test_fields_sent_switched_off_are_accepted(served, client):
    answer = client.completions.create(
        model=MODEL_ID, prompt="hi", max_tokens=2, temperature=0, logit_bias={}, best_of=1
    )
    assert answer.choices[0].text == served.reference(served.text_ids("hi"), None, 2)[1]


def test_completions_without_max_tokens_stop_at_openais_default_of_16(served, client):
    answer = client.completions.create(model=MODEL_ID, prompt=[5, 6, 7], temperature=0)
    tokens, text = served.reference([5, 6, 7], None, 16)
    assert answer.choices[0].text == text and answer.usage.completion_tokens == len(tokens)
    assert len(tokens) < 16 or answer.choices[0].finish_reason == "length"


def test_a_model_card_is_fetched_by_its_id(client):
    assert client.models.retrieve(MODEL_ID).parent is None
    card = client.models.retrieve(f"{MODEL_ID}:upper")
    assert card.id == f"{MODEL_ID}:upper" and card.parent == MODEL_ID and card.owned_by == "acme"
    assert client.models.retrieve("upper").id == f"{MODEL_ID}:upper"
    for unknown in ("nope", "other-base:upper"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(unknown)


def test_the_developer_role_is_the_system_role(served, client):
    def answer(role):
        messages = [{"role": role, "content": "be brief"}, *CHAT]
        out = client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=4, temperature=0
        )
        return out.choices[0].message.content, out.usage.prompt_tokens

    as_system = answer("system")
    assert as_system[1] == len(served.chat_ids([{"role": "system", "content": "be brief"}, *CHAT]))
    assert answer("developer") == as_system


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
         "only text content parts are supported, not 'image_url'"),
        ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt 1 is an empty list of token ids"),
        ("/v1/completions", {"prompt": ["a"] * 65}, "at most 64 prompts in one request"),
    ],
)  # fmt: skip
def test_unserved_shapes_get_one_clear_message(served, path, body, message):
    r = post(served, path, {"model": MODEL_ID, "max_tokens": 2, **body})
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]
    assert "valid string" not in r.json()["error"]["message"]  # no union dump


def test_an_assistant_turn_without_content_reads_as_empty(served, client):
    """History that replays a refusal or tool calls has an assistant turn whose content is
    null, as OpenAI allows; it is the empty turn. A user turn needs content."""
    turns = [*CHAT, {"role": "assistant", "content": None}, {"role": "user", "content": "and?"}]
    answer = client.chat.completions.create(
        model=MODEL_ID, messages=turns, max_tokens=3, temperature=0
    )
    empty = [*CHAT, {"role": "assistant", "content": ""}, {"role": "user", "content": "and?"}]
    assert answer.choices[0].message.content == served.reference(served.chat_ids(empty), None, 3)[1]
    r = post(served, "/v1/chat/completions",
             {"model": MODEL_ID, "messages": [{"role": "user", "content": None}]})  # fmt: skip
    assert r.status_code == 400 and "a user message needs content" in r.json()["error"]["message"]
