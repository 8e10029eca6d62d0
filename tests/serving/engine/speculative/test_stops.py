"""Stop strings, stop ids, EOS and max_tokens that fall inside an accepted run are honoured
exactly: the output equals plain decoding's, never a token past the stop."""

import dataclasses

import pytest

from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.test_engine_peft import Collector
from tests.serving.engine.world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("stop-world"))


def run(engine, request):
    got = Collector()
    engine.submit(request, got.sink)
    engine.run_until_idle()
    done = got.done[request.request_id]
    return got.tokens[request.request_id], done.finish_reason


def texts(engine, request):
    pieces = []
    engine.submit(request, lambda out: pieces.append(out.new_text))
    engine.run_until_idle()
    return "".join(pieces)


@pytest.fixture(scope="module")
def free_run(world):
    """(prompt, twenty greedy tokens with nothing to stop them): where the stops are placed.

    The first prompt whose run starts with six different tokens, so each stop is unique, and
    whose 6th token has visible text, to serve as a stop string.
    """
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    for i in range(50):
        prompt = (7 + i, 8, 9, 7 + i, 8)
        tokens, _ = run(world.engine(), GenerateRequest(f"free{i}", prompt, params))
        decode = world.tokenizer.decode
        if len(set(tokens[:6])) == 6 and decode(tokens[:6])[len(decode(tokens[:5])) :].strip():
            return prompt, tokens
    raise AssertionError("no prompt gives a varied run")


def cases(world, free):
    base = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    decode = world.tokenizer.decode
    stop_text = decode(free[:6])[len(decode(free[:5])) :]  # the 6th token's text
    return {
        "max_tokens": dataclasses.replace(base, max_tokens=6),
        "stop_token_ids": dataclasses.replace(base, stop_token_ids=(free[5],)),
        "stop_string": dataclasses.replace(base, stop=(stop_text,)),
        "eos": dataclasses.replace(base, ignore_eos=False),
    }


@pytest.mark.parametrize("case", ["max_tokens", "stop_token_ids", "stop_string", "eos"])
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_stop_inside_an_accepted_run(world, free_run, case, method, monkeypatch):
    prompt, free = free_run
    params = cases(world, free)[case]
    if case == "eos":  # make the 6th generated token an end-of-sequence id
        monkeypatch.setattr(world.tokenizer, "eos_token_ids", (free[5],))
    request = GenerateRequest(f"{case}-{method}", prompt, params)
    plain = world.engine()
    engine = spec_engine(world, method, draft="same", k=8)
    want, want_reason = run(plain, request)
    got, reason = run(engine, request)
    assert (got, reason) == (want, want_reason)
    assert len(got) <= 6
    if method == "draft_model":  # a perfect draft: the stop fell inside a kept run
        assert engine.spec.stats.total.accepted >= len(got) - 2
    assert texts(engine, dataclasses.replace(request, request_id="t")) == texts(
        plain, dataclasses.replace(request, request_id="t")
    )
