"""Greedy generation with PEFT's LoRA variants (DoRA, lora_bias, rank/alpha patterns, DoRA +
rsLoRA) against transformers + PEFT generating each request alone, token for token: each
variant on its own, then all of them in one staggered batch with plain adapters and base rows."""

import pytest
import torch

from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.variants import MIX, VARIANTS, variant_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return variant_world(tmp_path_factory.mktemp("variants"))


def requests_for(world, names, seed=0, prefix="r"):
    """A request per name (None: base-only), prompts of 3-20 tokens, 4-10 new tokens."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(names):
        n = int(torch.randint(3, 21, (1,), generator=gen))
        prompt = tuple(torch.randint(0, 512, (n,), generator=gen).tolist())
        max_new = int(torch.randint(4, 11, (1,), generator=gen))
        version = world.versions[name] if name else None
        out.append((GenerateRequest(f"{prefix}{i}", prompt, greedy(max_new), version), name))
    return out


def run_staggered(engine, requests):
    """Submit two at a time with two steps between, so arrivals join a running batch."""
    got = Collector()
    for i, (request, _) in enumerate(requests):
        engine.submit(request, got.sink)
        if i % 2 == 1:
            engine.step()
            engine.step()
    engine.run_until_idle()
    return got


def assert_matches_peft(world, requests, got):
    for request, name in requests:
        want = world.reference(list(request.prompt_token_ids), name, request.sampling.max_tokens)
        assert got.tokens[request.request_id] == want, (request.request_id, name)
        assert got.done[request.request_id].finish_reason == "length"


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_alone_matches_peft(world, name):
    requests = requests_for(world, [name] * 2, seed=len(name))
    got = run_staggered(world.engine(), requests)
    assert_matches_peft(world, requests, got)
    # The variant really steers generation: the base model alone says something else.
    base = [
        world.reference(list(r.prompt_token_ids), None, r.sampling.max_tokens) for r, _ in requests
    ]
    assert any(got.tokens[r.request_id] != b for (r, _), b in zip(requests, base)), name


def test_all_variants_mixed_in_one_staggered_batch_match_peft(world):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=48, max_loras=8)
    requests = requests_for(world, MIX * 2, seed=1)
    got = run_staggered(world.engine(scheduler=sched), requests)
    assert_matches_peft(world, requests, got)
