"""Speculation over adapters outside the decoder layers: greedy output with either proposer
equals greedy output without speculation for a staggered batch of an embed_tokens + lm_head
LoRA, trainable tokens, plain adapters and base rows; the target verifies each row with its
own embedding and head terms."""

import pytest
import torch

from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.outer_world import MIX, OUTER, carrying_ids, outer_world
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.speculative.test_greedy_equality import run_staggered
from tests.serving.engine.test_engine_peft import greedy


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return outer_world(tmp_path_factory.mktemp("spec-outer"))


def motif_requests(world, names, seed=0):
    """A request per name; prompts repeat a motif carrying trained ids, so the n-gram proposer
    finds matches and the trained rows enter prefill, proposals and verification."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(names):
        motif = carrying_ids(gen, int(torch.randint(2, 6, (1,), generator=gen)))
        prompt = motif * int(torch.randint(2, 5, (1,), generator=gen))
        max_new = int(torch.randint(6, 16, (1,), generator=gen))
        version = world.versions[name] if name else None
        out.append(GenerateRequest(f"r{i}", tuple(prompt), greedy(max_new), version))
    return out


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_output_unchanged_by_speculation(world, method):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=8)
    # Seed 3: the trainable-tokens rows too fall into repeats the n-gram proposer matches.
    requests = motif_requests(world, MIX * 2, seed=3)
    plain = run_staggered(world.engine(embeddings=True, scheduler=sched), requests)
    engine = spec_engine(world, method, scheduler=sched, embeddings=True)
    got = run_staggered(engine, requests)
    for r in requests:
        assert got.tokens[r.request_id] == plain.tokens[r.request_id], r.request_id
        assert got.done[r.request_id].finish_reason == "length"
    stats = engine.spec.stats
    assert stats.total.steps > 0 and stats.total.accepted > 0  # speculation really ran
    for name in OUTER:  # every such adapter's rows went through verification
        assert stats.by_adapter[stats.label(world.versions[name])].steps > 0, name


def test_outer_draft_companions_make_a_perfect_draft(world):
    """Draft = the base, each adapter its own companion in a draft slab with embeddings: the
    draft then equals the target, so every proposal is kept."""
    requests = motif_requests(world, [*OUTER, None], seed=1)
    engine = spec_engine(
        world, "draft_model", draft="same", companions=tuple(OUTER), embeddings=True
    )
    got = run_staggered(engine, requests)
    plain = run_staggered(world.engine(embeddings=True), requests)
    for r in requests:
        assert got.tokens[r.request_id] == plain.tokens[r.request_id], r.request_id
    stats = engine.spec.stats
    for name in OUTER:
        assert stats.by_adapter[stats.label(world.versions[name])].acceptance_rate == 1.0, name
