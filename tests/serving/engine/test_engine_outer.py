"""Greedy generation with adapters outside the decoder layers (LoRA on embed_tokens + lm_head,
PEFT's trainable tokens) against transformers + PEFT generating each request alone, token for
token: each on its own, then both in one staggered batch with plain adapters and base rows."""

import pytest
import torch

from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.outer_world import IDS, MIX, OUTER, carrying_ids, outer_world
from tests.serving.engine.test_engine_peft import greedy
from tests.serving.engine.test_engine_variants import assert_matches_peft, run_staggered


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return outer_world(tmp_path_factory.mktemp("outer"))


def requests_for(world, names, seed=0):
    """A request per name (None: base-only): prompts of 4-20 tokens carrying IDS, 6-12 new."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(names):
        prompt = tuple(carrying_ids(gen, int(torch.randint(4, 21, (1,), generator=gen))))
        max_new = int(torch.randint(6, 13, (1,), generator=gen))
        version = world.versions[name] if name else None
        out.append((GenerateRequest(f"r{i}", prompt, greedy(max_new), version), name))
    return out


@pytest.mark.parametrize("name", OUTER)
def test_each_alone_matches_peft(world, name):
    requests = requests_for(world, [name] * 3, seed=len(name))
    got = run_staggered(world.engine(embeddings=True), requests)
    assert_matches_peft(world, requests, got)
    # The adapter really steers generation: the base model alone says something else.
    base = [
        world.reference(list(r.prompt_token_ids), None, r.sampling.max_tokens) for r, _ in requests
    ]
    assert any(got.tokens[r.request_id] != b for (r, _), b in zip(requests, base)), name


def test_mixed_in_one_staggered_batch_match_peft(world):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=48, max_loras=8)
    requests = requests_for(world, MIX * 3, seed=1)
    got = run_staggered(world.engine(embeddings=True, scheduler=sched), requests)
    assert_matches_peft(world, requests, got)
    # Decoding fed a trained id back in at least once: its own row at decode, not only prefill.
    emitted = [t for r, n in requests if n == "tokens" for t in got.tokens[r.request_id][:-1]]
    assert set(emitted) & set(IDS)
