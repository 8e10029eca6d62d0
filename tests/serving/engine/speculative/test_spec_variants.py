"""Speculation over PEFT's LoRA variants: greedy output with either proposer equals greedy
output without speculation, for a staggered batch of DoRA, lora_bias, rank/alpha patterns,
DoRA + rsLoRA, plain adapters and base rows; the target verifies with the variants."""

import pytest
import torch

from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.speculative.test_greedy_equality import run_staggered
from tests.serving.engine.test_engine_peft import greedy
from tests.serving.engine.variants import MIX, VARIANTS, variant_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return variant_world(tmp_path_factory.mktemp("spec-variants"))


def motif_requests(world, names, seed=0):
    """A request per name; prompts repeat a motif, so the n-gram proposer finds matches."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(names):
        motif = torch.randint(
            0, 512, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen
        )
        prompt = motif.repeat(int(torch.randint(2, 5, (1,), generator=gen))).tolist()
        max_new = int(torch.randint(6, 16, (1,), generator=gen))
        version = world.versions[name] if name else None
        out.append(GenerateRequest(f"r{i}", tuple(prompt), greedy(max_new), version))
    return out


@pytest.mark.parametrize(
    ("method", "draft"), [("ngram", "small"), ("draft_model", "small")], ids=["ngram", "draft"]
)
def test_greedy_output_unchanged_by_speculation(world, method, draft):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=8)
    requests = motif_requests(world, MIX * 2)
    plain = run_staggered(world.engine(scheduler=sched), requests)
    engine = spec_engine(world, method, draft=draft, scheduler=sched)
    got = run_staggered(engine, requests)
    for r in requests:
        assert got.tokens[r.request_id] == plain.tokens[r.request_id], r.request_id
        assert got.done[r.request_id].finish_reason == "length"
    stats = engine.spec.stats
    assert stats.total.steps > 0 and stats.total.accepted > 0  # speculation really ran
    for name in VARIANTS:  # every variant's rows went through verification
        assert stats.by_adapter[stats.label(world.versions[name])].steps > 0, name


def test_variant_draft_companions_make_a_perfect_draft(world):
    """Draft = the base, each variant its own companion (the draft slab computes DoRA's norms
    from the draft's weights): the draft then equals the target, so every proposal is kept."""
    requests = motif_requests(world, [*VARIANTS, None], seed=1)
    engine = spec_engine(world, "draft_model", draft="same", companions=tuple(VARIANTS))
    got = run_staggered(engine, requests)
    plain = run_staggered(world.engine(), requests)
    for r in requests:
        assert got.tokens[r.request_id] == plain.tokens[r.request_id], r.request_id
    stats = engine.spec.stats
    for name in VARIANTS:
        assert stats.by_adapter[stats.label(world.versions[name])].acceptance_rate == 1.0, name
