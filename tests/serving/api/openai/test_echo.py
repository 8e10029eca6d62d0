"""Prompt log-probabilities over HTTP: /v1/completions' `echo` (OpenAI's legacy shape, as
lm-evaluation-harness reads it) and vLLM's `prompt_logprobs`, through the `openai` client,
against transformers + PEFT scoring the prompt under the adapter `model` names."""

import json

import httpx
import pytest
import torch

from tests.serving.api.served import ACME, MODEL_ID

TOL = 1e-4
AUTH = {"Authorization": f"Bearer {ACME}"}


def reference(world, ids: list[int], name: str | None) -> torch.Tensor:
    """log p of every vocabulary token at each position of ids [P, V], float64."""
    x = torch.tensor([ids])
    with torch.no_grad():
        if name is None:
            with world.peft.disable_adapter():
                logits = world.peft(x).logits
        else:
            world.peft.set_adapter(name)
            logits = world.peft(x).logits
    return torch.log_softmax(logits[0].double(), dim=-1)


def scores(world, ids, name) -> list[float]:
    want = reference(world, ids, name)
    return [float(want[p - 1, ids[p]]) for p in range(1, len(ids))]


@pytest.mark.parametrize("name", ["upper", "mlp", None])
def test_echo_with_max_tokens_0_answers_the_prompt_and_its_logprobs(served, client, name):
    text = "The quick brown fox jumps"
    ids = served.text_ids(text)
    r = client.completions.create(model=name or MODEL_ID, prompt=text, echo=True, logprobs=2,
                                  max_tokens=0, temperature=0)  # fmt: skip
    choice = r.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and all(len(t) <= 2 for t in lp.top_logprobs[1:])
    assert lp.token_logprobs[1:] == pytest.approx(scores(served.world, ids, name), abs=TOL)
    # the offsets point into the echoed text (the BOS takes none of it)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] < len(text)


def test_echo_as_lm_eval_sends_it_token_ids_and_one_token_more(served, client):
    ids = served.text_ids("Question: 2 + 2? Answer: four")
    r = client.completions.create(model="rot13", prompt=ids, echo=True, logprobs=1,
                                  max_tokens=1, temperature=0)  # fmt: skip
    choice = r.choices[0]
    tokens, text = served.reference(ids, "rot13", 1)
    assert choice.text == served.world.tokenizer.decode(ids) + text
    got = choice.logprobs.token_logprobs
    assert len(got) == len(ids) + 1 and got[0] is None
    assert got[1 : len(ids)] == pytest.approx(scores(served.world, ids, "rot13"), abs=TOL)
    # the generated token's logprob is the prompt's last row: its likeliest token's
    assert got[-1] == pytest.approx(float(reference(served.world, ids, "rot13")[-1].max()),
                                    abs=TOL)  # fmt: skip
    assert choice.logprobs.tokens[-1] == served.world.tokenizer.decode(tokens)


def test_prompt_logprobs_on_completions_are_vllms_shape(served, client):
    ids = served.text_ids("a b c d e f")
    r = client.completions.create(model="mlp", prompt=ids, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 3})  # fmt: skip
    got = r.model_dump()["choices"][0]["prompt_logprobs"]
    want = reference(served.world, ids, "mlp")
    assert len(got) == len(ids) and got[0] is None
    for p, entry in enumerate(got[1:], start=1):
        row = want[p - 1]
        own = entry[str(ids[p])]
        assert own["logprob"] == pytest.approx(float(row[ids[p]]), abs=TOL)
        assert own["rank"] == int((row > row[ids[p]]).sum()) + 1
        assert own["decoded_token"] == served.world.tokenizer.decode([ids[p]])
        top = row.topk(3)
        for k, (t, v) in enumerate(zip(top.indices.tolist(), top.values.tolist())):
            assert entry[str(t)]["logprob"] == pytest.approx(v, abs=TOL)
            assert entry[str(t)]["rank"] == k + 1 or t == ids[p]
        assert len(entry) in (3, 4)  # the token itself, when not among the top 3


def test_prompt_logprobs_and_echo_of_several_prompts_and_choices(served, client):
    texts = ["one two", "three four five"]
    r = client.completions.create(model="upper", prompt=texts, n=2, echo=True, max_tokens=2,
                                  temperature=0, extra_body={"prompt_logprobs": 0})  # fmt: skip
    assert len(r.choices) == 4
    for choice in r.model_dump()["choices"]:
        text = texts[choice["index"] // 2]
        ids = served.text_ids(text)
        _, completion = served.reference(ids, "upper", 2)
        assert choice["text"] == text + completion and choice["logprobs"] is None
        got = [None] + [e[str(t)]["logprob"] for e, t in zip(choice["prompt_logprobs"][1:],
                                                             ids[1:])]  # fmt: skip
        assert got[1:] == pytest.approx(scores(served.world, ids, "upper"), abs=TOL)


def test_an_echo_streams_the_prompt_first(served, client):
    text = "stream me please"
    ids = served.text_ids(text)
    chunks = list(client.completions.create(model="upper", prompt=text, echo=True, logprobs=0,
                                            max_tokens=3, temperature=0, stream=True))  # fmt: skip
    first = chunks[0].choices[0]
    assert first.text == text
    assert first.logprobs.token_logprobs[0] is None
    assert first.logprobs.token_logprobs[1:] == pytest.approx(
        scores(served.world, ids, "upper"), abs=TOL
    )
    _, completion = served.reference(ids, "upper", 3)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text + completion
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs
               for o in c.choices[0].logprobs.text_offset]  # fmt: skip
    assert len(offsets) == len(ids) + 3 and offsets == sorted(offsets)


def test_prompt_logprobs_on_chat_sit_beside_the_choices(served, client):
    messages = [{"role": "user", "content": "hello there"}]
    ids = served.chat_ids(messages)
    r = client.chat.completions.create(model="mlp", messages=messages, max_tokens=1,
                                       extra_body={"prompt_logprobs": 1})  # fmt: skip
    got = r.model_dump()["prompt_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    values = [e[str(t)]["logprob"] for e, t in zip(got[1:], ids[1:])]
    assert values == pytest.approx(scores(served.world, ids, "mlp"), abs=TOL)


@pytest.mark.parametrize(
    ("path", "body", "field", "words"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True},
         "echo", "send prompt_logprobs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens",
         "0 is served with echo: true"),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs",
         "less than or equal to 20"),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True},
         "prompt_logprobs", "send stream: false"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "prompt_logprobs": -1}, "prompt_logprobs", "greater than"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(served, path, body, field, words):
    r = httpx.post(served.url + path, json={"model": MODEL_ID, **body}, headers=AUTH)
    assert r.status_code == 400, r.text
    error = json.loads(r.text)["error"]
    assert error["param"] == field and words in error["message"], error
