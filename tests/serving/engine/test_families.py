"""Every engine feature on the newer families, Qwen3 (q/k norms), Phi-3 (fused linears, a
sliding window of 24 inside these contexts), Gemma 2 (attention scores soft-capped) and
Gemma 3 (a sliding and a global layer): a mixed batch with a different adapter per row
token for token against transformers + PEFT, speculation by both proposers as lossless, a
cached prefix answering as a fresh one, and structured output."""

import json

import pytest
import torch

from serving.engine.request import GenerateRequest, ResponseFormat, SamplingParams
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.speculative.test_greedy_equality import run_staggered
from tests.serving.engine.test_engine_peft import greedy
from tests.serving.engine.world import ADAPTERS, build_world

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module", params=["qwen3", "phi3", "gemma2", "gemma3", "qwen3_moe"])
def world(request, tmp_path_factory):
    return build_world(tmp_path_factory.mktemp(f"family-{request.param}"), request.param)


def requests(world, count=12, seed=0):
    """Over every adapter and base-only; prompts of a repeated motif (n-gram finds it), some
    past the sliding window."""
    names = [*ADAPTERS, None, None]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        motif = torch.randint(3, 512, (int(torch.randint(2, 6, (1,), generator=gen)),),
                              generator=gen)  # fmt: skip
        prompt = motif.repeat(int(torch.randint(2, 9, (1,), generator=gen))).tolist()
        name = names[i % len(names)]
        version = world.versions[name] if name else None
        out.append((GenerateRequest(f"r{i}", tuple(prompt), greedy(10), version), name))
    return out


def test_a_mixed_batch_matches_peft_token_for_token(world):
    reqs = requests(world)
    got = run_staggered(world.engine(), [r for r, _ in reqs])
    for request, name in reqs:
        want = world.reference(list(request.prompt_token_ids), name, 10)
        assert got.tokens[request.request_id] == want, (request.request_id, name)


@pytest.mark.parametrize(("method", "draft"), [("ngram", None), ("draft_model", "same")])
def test_speculation_is_lossless(world, method, draft):
    reqs = [r for r, _ in requests(world, seed=1)]
    plain = run_staggered(world.engine(), reqs)
    spec = run_staggered(spec_engine(world, method, draft=draft or "small", k=3), reqs)
    assert spec.tokens == plain.tokens


def test_a_cached_prefix_answers_as_a_fresh_one(world):
    engine, v = world.engine(), world.versions["rot13"]
    prompt = tuple(range(10, 41))  # 31 tokens, past the window
    first = run_staggered(engine, [GenerateRequest("a", prompt, greedy(6), v)])
    second = run_staggered(engine, [GenerateRequest("b", prompt, greedy(6), v)])
    assert second.done["b"].cached_tokens == 28 and first.done["a"].cached_tokens == 0
    assert second.tokens["b"] == first.tokens["a"] == world.reference(list(prompt), "rot13", 6)


def test_structured_output_holds_on_every_row(world):
    f = ResponseFormat("json_schema", json.dumps(SCHEMA, separators=(",", ":")), strict=True)
    engine = world.engine()
    try:
        engine.grammars.compiler.compile_now(f)
        reqs = [GenerateRequest(f"s{i}", tuple(range(20 + i, 35)),
                                SamplingParams(max_tokens=40, temperature=1.0, seed=i),
                                world.versions.get(name), response_format=f)
                for i, name in enumerate(["upper", None, "mlp", "qk"])]  # fmt: skip
        got = run_staggered(engine, reqs)
    finally:
        engine.shutdown()
    for r in reqs:
        text = world.tokenizer.decode(got.tokens[r.request_id])
        assert got.done[r.request_id].finish_reason == "stop", text
        assert set(json.loads(text)) == {"ok"}
