"""Prompt log-probabilities (SamplingParams.prompt_logprobs) against transformers + PEFT
scoring the prompt alone, in float64: under each row's adapter, in batches mixed with other
adapters and free rows, across chunked prefill, a prefix-cache hit and max_tokens 0."""

import pytest
import torch

from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.world import build_world

TOL = 1e-4  # float32 engine against a float64 log_softmax of PEFT's float32 logits


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def reference(world, prompt: list[int], name: str | None) -> torch.Tensor:
    """log p(token | the tokens before it) of every vocabulary token at each position [P, V]."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        if name is None:
            with world.peft.disable_adapter():
                logits = world.peft(ids).logits
        else:
            world.peft.set_adapter(name)
            logits = world.peft(ids).logits
    return torch.log_softmax(logits[0].double(), dim=-1)


def assert_matches(world, prompt, name, got, n):
    want = reference(world, prompt, name)
    assert len(got) == len(prompt) and got[0] is None
    for p, entry in enumerate(got[1:], start=1):
        row = want[p - 1]
        assert entry.token_id == prompt[p]
        assert entry.logprob == pytest.approx(float(row[prompt[p]]), abs=TOL), (name, p)
        assert (
            entry.rank == int((row > row[prompt[p]] + TOL).sum()) + 1
            or abs(float(row.sort(descending=True).values[entry.rank - 1]) - entry.logprob) < TOL
        )  # a near tie may order either way
        top_want = row.topk(n)
        assert [v for _, v in entry.top] == pytest.approx(top_want.values.tolist(), abs=TOL)


class Collector:
    def __init__(self):
        self.tokens, self.done, self.prompt = {}, {}, {}

    def sink(self, out):
        self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.prompt_logprobs:
            assert out.request_id not in self.prompt, "prompt logprobs come once"
            self.prompt[out.request_id] = out.prompt_logprobs
        if out.finished:
            self.done[out.request_id] = out


def params(max_tokens=3, prompt_logprobs=None):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                          prompt_logprobs=prompt_logprobs)  # fmt: skip


def prompts(count, seed=0, low=3, high=30):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(
            1, 512, (int(torch.randint(low, high, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(count)
    ]


def test_mixed_batch_of_adapters_and_free_rows_matches_peft(world):
    # a small token budget: the long prompts are chunked, next to others' decodes
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, max_loras=8)
    engine = world.engine(scheduler=config)
    names = ["upper", "mlp", None, "rot13", "upper", None, "qk", "ov"]
    asks = [2, None, 5, 0, None, 1, 3, None]  # None: a free row, which asks nothing
    got, requests = Collector(), []
    for i, (prompt, name, n) in enumerate(zip(prompts(len(names)), names, asks)):
        version = world.versions[name] if name else None
        request = GenerateRequest(f"r{i}", tuple(prompt), params(3, n), version)
        requests.append((request, name, n))
        engine.submit(request, got.sink)
    engine.run_until_idle()
    for request, name, n in requests:
        rid, prompt = request.request_id, list(request.prompt_token_ids)
        assert got.tokens[rid] == world.reference(prompt, name, 3), rid
        if n is None:
            assert rid not in got.prompt
        else:
            assert_matches(world, prompt, name, got.prompt[rid], n)


def test_a_prompt_longer_than_the_step_budget_is_scored_across_its_chunks(world):
    engine = world.engine(scheduler=SchedulerConfig(max_num_batched_tokens=7))
    prompt = prompts(1, seed=3, low=40, high=41)[0]
    got = Collector()
    engine.submit(GenerateRequest("long", tuple(prompt), params(2, 4), world.versions["mlp"]),
                  got.sink)  # fmt: skip
    engine.submit(GenerateRequest("free", (1, 2, 3), params(6)), got.sink)
    engine.run_until_idle()
    assert_matches(world, prompt, "mlp", got.prompt["long"], 4)
    assert got.tokens["long"] == world.reference(prompt, "mlp", 2)


def test_a_prefix_cache_hit_does_not_drop_the_prompts_logits(world):
    engine = world.engine()
    prompt = prompts(1, seed=5, low=20, high=21)[0]
    version = world.versions["rot13"]
    answers = []
    for i in range(2):
        got = Collector()
        engine.submit(GenerateRequest(f"same{i}", tuple(prompt), params(2, 3), version), got.sink)
        engine.run_until_idle()
        answers.append(got.prompt[f"same{i}"])
        assert got.done[f"same{i}"].cached_tokens == 0  # computed again: every row scored
    assert answers[0] == answers[1]
    assert_matches(world, prompt, "rot13", answers[1], 3)
    # its blocks were cached all the same: a request that asks nothing hits them
    got = Collector()
    engine.submit(GenerateRequest("plain", tuple(prompt), params(2), version), got.sink)
    engine.run_until_idle()
    assert got.done["plain"].cached_tokens > 0


def test_max_tokens_0_returns_the_prompts_logprobs_and_no_token(world):
    engine, got = world.engine(), Collector()
    prompt = prompts(1, seed=7)[0]
    engine.submit(GenerateRequest("echo", tuple(prompt), params(0, 1), world.versions["qk"]),
                  got.sink)  # fmt: skip
    engine.submit(GenerateRequest("none", tuple(prompt), params(0)), got.sink)
    engine.run_until_idle()
    for rid in ("echo", "none"):
        out = got.done[rid]
        assert got.tokens.get(rid, []) == [] and out.finish_reason == "length"
        assert out.completion_tokens == 0 and out.prompt_tokens == len(prompt)
    assert "none" not in got.prompt
    assert_matches(world, prompt, "qk", got.prompt["echo"], 1)


def test_a_one_token_prompt_has_only_the_null_entry(world):
    engine, got = world.engine(), Collector()
    engine.submit(GenerateRequest("one", (7,), params(1, 2)), got.sink)
    engine.run_until_idle()
    assert got.prompt["one"] == (None,)


def test_a_negative_prompt_logprobs_is_refused(world):
    with pytest.raises(ValueError, match="prompt_logprobs must be at least 0"):
        world.engine().submit(GenerateRequest("x", (1, 2), params(1, -1)), lambda out: None)


def test_rows_scoring_prompts_beside_rows_verifying_proposals(world):
    from tests.serving.engine.speculative.spec_world import spec_engine

    engine = spec_engine(world, "ngram", scheduler=SchedulerConfig(max_num_batched_tokens=16))
    names = ["upper", None, "mlp", "rot13", None, "upper"]
    got, requests = Collector(), []
    for i, name in enumerate(names):
        prompt = [5, 6, 7, 8] * 3 + [i]  # a motif n-gram proposes from
        version = world.versions[name] if name else None
        request = GenerateRequest(f"s{i}", tuple(prompt), params(8, 2 if i % 2 else None), version)
        requests.append((request, name))
        engine.submit(request, got.sink)
        engine.step()  # staggered: each prompt's chunks meet the others' speculating decodes
    engine.run_until_idle()
    assert engine.spec.stats.total.steps > 0  # speculation really ran
    for request, name in requests:
        prompt, rid = list(request.prompt_token_ids), request.request_id
        assert got.tokens[rid] == world.reference(prompt, name, 8), rid
        if request.sampling.prompt_logprobs is not None:
            assert_matches(world, prompt, name, got.prompt[rid], 2)
