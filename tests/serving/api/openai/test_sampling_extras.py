"""OpenAI's logit_bias and vLLM's min_p, stop_token_ids and ignore_eos through the `openai`
client. References: a +100 bias makes its token certain; a -100 bias on the greedy token
leaves the runner-up the unbiased answer's top_logprobs name; min_p 1 keeps only the
likeliest token, so sampling at any seed equals greedy; a stop token id ends the greedy
answer where that token first appears."""

import openai
import pytest

from serving.api.openai.schemas import CompletionRequest
from tests.serving.api.served import MODEL_ID

PROMPT = [5, 6, 7, 8]


def complete(client, **kwargs):
    kwargs = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **kwargs}
    return client.completions.create(**kwargs).choices[0]


def plain_token(served, avoid=()) -> int:
    """A token that decodes to visible text alone and is no end of sequence."""
    tok = served.world.tokenizer
    return next(
        i for i in range(100, tok.vocab_size)
        if i not in tok.eos_token_ids and i not in avoid and tok.decode([i]).strip().isalpha()
    )  # fmt: skip


def test_a_full_bias_makes_its_token_certain_in_chat_and_completions(served, client):
    x = plain_token(served)
    choice = complete(client, logit_bias={str(x): 100}, temperature=1, seed=3)
    assert choice.text == served.world.tokenizer.decode([x] * 6)
    chat = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        logit_bias={str(x): 100},
    )  # fmt: skip
    assert chat.choices[0].message.content == served.world.tokenizer.decode([x] * 3)


def test_a_negative_bias_on_the_greedy_token_leaves_the_runner_up(served, client):
    plain = complete(client, max_tokens=1, logprobs=2)
    greedy, runner_up = plain.logprobs.top_logprobs[0]  # token texts, best first
    ids, _ = served.reference(PROMPT, None, 1)
    biased = complete(client, max_tokens=1, logit_bias={str(ids[0]): -100}, logprobs=1)
    assert plain.logprobs.tokens == [greedy] and greedy != runner_up
    assert biased.logprobs.tokens == [runner_up]


def test_min_p_of_one_keeps_only_the_likeliest_token(served, client):
    greedy = complete(client).text
    for seed in range(3):
        assert (
            complete(client, temperature=1.5, seed=seed, extra_body={"min_p": 1.0}).text == greedy
        )
    assert any(complete(client, temperature=1.5, seed=s).text != greedy for s in range(5))


def test_a_stop_token_id_ends_the_answer_where_it_first_appears(served, client):
    ids, _ = served.reference(PROMPT, None, 6)
    stop = ids[2]
    first = ids.index(stop)
    choice = complete(client, extra_body={"stop_token_ids": [stop]})
    assert choice.finish_reason == "stop"
    assert choice.text == served.world.tokenizer.decode(ids[:first])


def test_ignore_eos_runs_past_a_certain_end_of_sequence(served, client):
    eos = served.world.tokenizer.eos_token_ids[0]
    ended = complete(client, logit_bias={str(eos): 100})
    assert (ended.text, ended.finish_reason) == ("", "stop")
    past = complete(client, logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert past.finish_reason == "length"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"logit_bias": {"abc": 1}}, "'abc' is not a token id"),
        ({"logit_bias": {"-3": 1}}, "'-3' is not a token id"),
        ({"logit_bias": {"5": 101}}, "less than or equal to 100"),
        (
            {"logit_bias": {"99999999": 1}},
            "logit_bias: token id 99999999 is outside the vocabulary",
        ),
        ({"logit_bias": {str(i): 1 for i in range(1025)}}, "at most 1024 token ids"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop_token_ids": [-1]}, "stop_token_ids: token id -1 is outside the vocabulary"),
    ],
)
def test_bad_values_are_refused_naming_the_field(client, extra, words):
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        complete(client, extra_body=extra)
    assert caught.value.param.split(".")[0] in extra, caught.value.param  # OpenAI's param


def test_two_spellings_of_one_token_id_add_their_biases():
    body = CompletionRequest(model=MODEL_ID, prompt="x", logit_bias={"5": 30, "05": 40, "7": 0})
    assert body.biases() == ((5, 70.0),)
