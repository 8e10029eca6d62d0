"""Greedy output with speculation equals greedy output without it, token for token: a mixed
batch over 6 adapters plus base-only rows, both proposers, staggered arrivals, preemption.
So does a seeded request's sampled output."""

import dataclasses

import pytest
import torch

from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import ADAPTERS, build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("spec-world"))


def mixed_requests(world, params=None, count=16, seed=0):
    """Requests over every adapter and base-only; prompts repeat a motif (n-gram finds it)."""
    names = [*ADAPTERS, None, None] * 2
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        name = names[i % len(names)]
        motif = torch.randint(
            0, 512, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen
        )
        prompt = motif.repeat(int(torch.randint(2, 5, (1,), generator=gen))).tolist()
        max_new = int(torch.randint(4, 24, (1,), generator=gen))
        p = params or greedy(max_new)
        version = world.versions[name] if name else None
        out.append(GenerateRequest(f"r{i}", tuple(prompt), p, version))
    return out


def run_staggered(engine, requests):
    got = Collector()
    for i, request in enumerate(requests):
        engine.submit(request, got.sink)
        if i % 3 == 2:
            engine.step()
            engine.step()
    engine.run_until_idle()
    return got


@pytest.mark.parametrize(
    ("method", "draft", "num_blocks"),
    [
        ("ngram", None, 256),
        ("draft_model", "small", 256),
        ("draft_model", "same", 256),
        ("ngram", None, 40),
        ("draft_model", "small", 40),
    ],
    ids=["ngram", "draft", "perfect-draft", "ngram-preempt", "draft-preempt"],
)
def test_greedy_output_unchanged_by_speculation(world, method, draft, num_blocks):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=8)
    requests = mixed_requests(world)
    plain = run_staggered(world.engine(scheduler=sched), requests)
    engine = spec_engine(
        world, method, draft=draft or "small", num_blocks=num_blocks, scheduler=sched
    )
    got = run_staggered(engine, requests)
    for r in requests:
        assert got.tokens[r.request_id] == plain.tokens[r.request_id], r.request_id
        assert got.done[r.request_id].finish_reason == "length"
    stats = engine.spec.stats
    assert stats.total.steps > 0 and stats.total.accepted > 0  # speculation really ran
    if num_blocks == 40:
        assert engine.scheduler.num_preemptions > 0
    if draft == "same":
        assert stats.by_adapter["base"].acceptance_rate == 1.0


def test_matches_transformers_peft_too(world):
    """The speculative engine against the independent reference, for a few requests."""
    engine = spec_engine(world, "ngram")
    requests = mixed_requests(world, count=8, seed=3)
    got = run_staggered(engine, requests)
    names = {v: k for k, v in world.versions.items()}
    for r in requests:
        want = world.reference(
            list(r.prompt_token_ids), names.get(r.adapter), r.sampling.max_tokens
        )
        assert got.tokens[r.request_id] == want


def test_draft_companion_is_applied_for_its_adapter(world):
    """Draft = base; with the adapter's own LoRA as its companion, the draft is perfect for it."""
    requests = [
        GenerateRequest(f"c{i}", (5, 6, 7, 8, 9, i), greedy(16), world.versions["mlp"])
        for i in range(3)
    ]
    without = spec_engine(world, "draft_model", draft="same")
    run_staggered(without, requests)
    with_companion = spec_engine(world, "draft_model", draft="same", companions=("mlp",))
    got = run_staggered(with_companion, requests)
    assert with_companion.spec.stats.by_adapter["mlp"].acceptance_rate == 1.0
    assert without.spec.stats.by_adapter["mlp"].acceptance_rate < 1.0
    plain = run_staggered(world.engine(), requests)
    assert got.tokens == plain.tokens


def test_speculation_turns_off_above_max_batch_size(world):
    # base-only: an adapter's background load would make the running count depend on timing
    requests = [GenerateRequest(f"b{i}", (3, 4, 3, 4, i), greedy(4 + 4 * i)) for i in range(6)]
    engine = spec_engine(world, "draft_model", draft="same", max_batch_size=2)
    for r in requests:
        engine.submit(r, Collector().sink)
    for _ in range(4):  # six running: compute-bound by this config, so plain decoding
        engine.step()
    assert len(engine.scheduler.running) > 2 and engine.spec.stats.total.steps == 0
    engine.run_until_idle()
    assert engine.spec.stats.total.steps > 0  # as the batch drains below 3, it speculates again


def test_sampled_requests_with_logprobs_and_penalties_run(world):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7,
                            repetition_penalty=1.2, logprobs=2)  # fmt: skip
    engine = spec_engine(world, "draft_model", draft="same")
    requests = mixed_requests(world, params=params, count=6)
    got = run_staggered(engine, requests)
    for r in requests:
        assert len(got.tokens[r.request_id]) == 12
        assert got.done[r.request_id].completion_tokens == 12


@pytest.mark.parametrize(("method", "draft"), [("ngram", None), ("draft_model", "small")])
def test_a_seeded_request_samples_the_same_tokens_speculated_or_not(world, method, draft):
    """Sampled (temperature, top-p, a penalty), each request its own seed: the tokens of a
    plain engine, of a speculative one running them together, and of each one alone on it."""
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=8)
    requests = [
        dataclasses.replace(r, sampling=SamplingParams(
            max_tokens=16, temperature=0.9, top_p=0.95, repetition_penalty=1.1, seed=100 + i,
            ignore_eos=True))
        for i, r in enumerate(mixed_requests(world, count=8, seed=5))
    ]  # fmt: skip
    plain = run_staggered(world.engine(scheduler=sched), requests)
    engine = spec_engine(world, method, draft=draft or "small", scheduler=sched)
    together = run_staggered(engine, requests)
    stats = engine.spec.stats.total
    assert stats.steps > 0 and stats.accepted < stats.proposed  # verified, some drafts refused
    if method == "draft_model":  # (sampled text rarely repeats what an n-gram would find)
        assert stats.accepted > 0
    alone = run_staggered(engine, requests[:1])
    assert together.tokens == plain.tokens
    assert alone.tokens[requests[0].request_id] == plain.tokens[requests[0].request_id]
    assert len({tuple(t) for t in plain.tokens.values()}) == len(requests)
