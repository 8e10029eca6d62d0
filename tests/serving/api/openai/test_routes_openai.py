"""The OpenAI routes through the `openai` client against a live server: every greedy answer
equals the engine's own output for the same request run alone."""

import asyncio
import json

import httpx
import openai
import pytest

from tests.serving.api.served import ACME, ADMIN, GLOBEX, MAX_MODEL_LEN, MODEL_ID

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


# (how the adapter is named, the world's adapter it is)
CHOICES = [
    ({"model": "upper"}, "upper"),
    ({"model": f"{MODEL_ID}:rot13"}, "rot13"),
    ({"model": MODEL_ID, "extra_body": {"lora": "mlp"}}, "mlp"),
    ({"model": MODEL_ID, "extra_body": {"lora": f"{MODEL_ID}:upper"}}, "upper"),
    ({"model": MODEL_ID}, None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("choice", "adapter"), CHOICES, ids=lambda c: str(c))
def test_chat_equals_the_engine_alone(served, client, choice, adapter, stream):
    _, want = served.reference(served.chat_ids(CHAT), adapter, 6)
    kwargs = dict(messages=CHAT, max_tokens=6, temperature=0, **choice)
    if not stream:
        answer = client.chat.completions.create(**kwargs)
        assert answer.object == "chat.completion" and answer.model == choice["model"]
        assert answer.choices[0].message.role == "assistant"
        assert answer.choices[0].message.content == want
        assert answer.usage.prompt_tokens == len(served.chat_ids(CHAT))
        assert answer.usage.completion_tokens <= 6
        assert (
            answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
        )
        assert answer.usage.prompt_tokens_details.cached_tokens >= 0
        return
    chunks = list(
        client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("length", "stop") and all(r is None for r in reasons[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 6


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completion_equals_the_engine_alone(served, client, stream):
    ids = served.text_ids("once upon a time")
    _, want = served.reference(ids, "rot13", 7)
    for prompt in ("once upon a time", ids):  # text, then the same token ids
        kwargs = dict(model="rot13", prompt=prompt, max_tokens=7, temperature=0)
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            assert "".join(c.choices[0].text for c in chunks) == want
            assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        else:
            answer = client.completions.create(**kwargs)
            assert answer.object == "text_completion"
            assert answer.choices[0].text == want and answer.usage.prompt_tokens == len(ids)


def test_sixteen_concurrent_requests_each_equal_the_engine_alone(served):
    names = ["upper", "rot13", "mlp", None] * 4
    cases = [(f"story {i}: " + "ab" * (i % 5), name, 3 + i % 5) for i, name in enumerate(names)]
    wants = [served.reference(served.text_ids(p), n, m)[1] for p, n, m in cases]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0)
        calls = [
            client.completions.create(
                model=name or MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0
            )
            for prompt, name, max_tokens in cases
        ]
        return await asyncio.gather(*calls)

    answers = asyncio.run(run())
    assert [a.choices[0].text for a in answers] == wants


def test_models_lists_the_base_and_the_adapters_the_key_may_see(served):
    def ids(key):
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0)
        return {m.id: m for m in client.models.list().data}

    acme = ids(ACME)
    assert set(acme) == {MODEL_ID, f"{MODEL_ID}:upper", f"{MODEL_ID}:rot13", f"{MODEL_ID}:mlp"}
    assert acme[MODEL_ID].parent is None and acme[f"{MODEL_ID}:mlp"].parent == MODEL_ID
    assert acme[f"{MODEL_ID}:mlp"].owned_by == "acme"
    # what a key may use: globex owns none and none is public; an admin key is no different
    # (GET /v1/adapters lists every tenant's to it)
    assert set(ids(GLOBEX)) == {MODEL_ID}
    assert set(ids(ADMIN)) == {MODEL_ID}


def test_a_key_uses_another_tenants_adapter_only_once_it_is_public(served):
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=GLOBEX, max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="upper", prompt="hi", max_tokens=2, temperature=0)
    assert info.value.body["message"] == "unknown adapter 'upper'"
    served.registry.set_public("upper", "acme", True)
    try:
        answer = client.completions.create(model="upper", prompt="hi", max_tokens=2, temperature=0)
        assert answer.choices[0].text == served.reference(served.text_ids("hi"), "upper", 2)[1]
    finally:
        served.registry.set_public("upper", "acme", False)


def test_max_tokens_past_the_context_is_capped_with_length(served, client):
    ids = [(7 * i) % 500 + 3 for i in range(MAX_MODEL_LEN - 4)]
    tokens, text = served.reference(ids, None, 50)
    assert len(tokens) == 4  # the engine caps at max_model_len (this prompt meets no EOS)
    answer = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=50, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 4 and answer.choices[0].text == text


def test_stop_strings_cut_the_text(served, client):
    _, full = served.reference(served.text_ids("the stop test"), None, 12)
    stop = full[4:6]
    want = full[: full.index(stop)]
    answer = client.completions.create(
        model=MODEL_ID, prompt="the stop test", max_tokens=12, temperature=0, stop=[stop]
    )
    assert answer.choices[0].text == want and answer.choices[0].finish_reason == "stop"


def test_chat_logprobs(served, client):
    answer = client.chat.completions.create(
        model="upper", messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the likeliest


def test_completion_logprobs(served, client):
    answer = client.completions.create(
        model=MODEL_ID, prompt="abc", max_tokens=3, temperature=0, logprobs=1
    )
    lp = answer.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert lp.text_offset[0] == 0


def test_streamed_text_offsets_point_into_the_text_while_a_stop_string_holds_text_back(client):
    kwargs = dict(model=MODEL_ID, prompt="abc", max_tokens=12, temperature=0, logprobs=1)
    text = client.completions.create(**kwargs).choices[0].text
    # A stop string that never completes but starts with a character the answer holds: the
    # stream holds that character back one chunk each time, and offsets must not lag.
    held = max(set(text), key=text.count)
    chunks = list(client.completions.create(stream=True, stop=[held + "\x00"], **kwargs))
    tokens = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    offsets = [
        at
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for at in c.choices[0].logprobs.text_offset
    ]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert len(offsets) == 12 and offsets == sorted(offsets)
    whole = [(t, at) for t, at in zip(tokens, offsets, strict=True) if not t.startswith("bytes:")]
    assert len(whole) > 1 and all(text[at : at + len(t)] == t for t, at in whole)


def test_session_header_is_accepted(served):
    body = {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(
        f"{served.url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {ACME}", "x-session-affinity": "conv-1"},
    )
    assert r.status_code == 200 and json.loads(r.text)["choices"][0]["text"]
