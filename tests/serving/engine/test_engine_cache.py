"""(b) prefix cache, (c) preemption, (d) abort, (e) seeds, (f) adapter eviction mid-run."""

import pytest
import torch

from adapters.format.adapter import load_adapter
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world, model_tokens


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def run(engine, requests):
    got = Collector()
    for r in requests:
        engine.submit(r, got.sink)
    engine.run_until_idle()
    return got


PROMPT = tuple(range(10, 31))  # 21 tokens: 5 full blocks of 4, the last one holding token 21


def test_prefix_hit_same_output_fewer_tokens(world, monkeypatch):
    engine = world.engine()
    v = world.versions["upper"]
    first = run(engine, [GenerateRequest("a", PROMPT, greedy(5), v)])
    ran = model_tokens(engine, monkeypatch)
    second = run(engine, [GenerateRequest("b", PROMPT, greedy(5), v)])
    assert second.tokens["b"] == first.tokens["a"]
    assert first.done["a"].cached_tokens == 0
    assert second.done["b"].cached_tokens == 20  # 5 full blocks
    assert sum(ran) == len(PROMPT) - 20 + 4  # 1 prompt + 4 decodes


def test_no_hit_across_adapters_or_after_a_reupload(world, tmp_path):
    engine = world.engine()
    run(engine, [GenerateRequest("a", PROMPT, greedy(3), world.versions["upper"])])
    other = run(engine, [GenerateRequest("b", PROMPT, greedy(3), world.versions["mlp"])])
    base = run(engine, [GenerateRequest("c", PROMPT, greedy(3), None)])
    assert other.done["b"].cached_tokens == 0 and base.done["c"].cached_tokens == 0
    # Same name, new content: another version, so another cache key.
    old = world.adapters[world.versions["upper"]]
    files = {
        "adapter_config.json": old.config_bytes,
        "adapter_model.safetensors": bytearray(old.weights_bytes),
    }
    files["adapter_model.safetensors"][-4:] = b"\x00\x00\x80\x3f"  # one weight becomes 1.0
    new = load_adapter({k: bytes(v) for k, v in files.items()})
    version = f"upper@{new.digest}"
    world.adapters[version] = new
    again = run(engine, [GenerateRequest("d", PROMPT, greedy(3), version)])
    assert again.done["d"].cached_tokens == 0


def test_preemption_keeps_outputs(world):
    requests = [
        GenerateRequest(f"p{i}", tuple(range(i, i + 14)), greedy(10), world.versions[n])
        for i, n in enumerate(["upper", "mlp", "qk", "ov"])
    ]
    roomy = run(world.engine(), requests)
    tight_engine = world.engine(num_blocks=12)  # 48 token slots for 4 x 24 tokens
    tight = run(tight_engine, requests)
    assert tight_engine.scheduler.num_preemptions > 0
    assert tight.tokens == roomy.tokens
    assert tight_engine.blocks.num_free_blocks == 12


def test_abort_frees_blocks_and_unpins(world):
    engine = world.engine(num_slots=1, scheduler=SchedulerConfig(max_loras=1))
    got = Collector()
    engine.submit(GenerateRequest("x", PROMPT, greedy(50), world.versions["upper"]), got.sink)
    engine.step()
    engine.step()
    engine.abort("x")
    engine.step()
    assert got.done["x"].finish_reason == "abort"
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    after = run(engine, [GenerateRequest("y", PROMPT, greedy(2), world.versions["mlp"])])
    assert after.done["y"].finish_reason == "length"  # the only slot was unpinned


def test_seeded_sampling_is_independent_of_the_batch(world):
    seeded = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = run(world.engine(), [GenerateRequest("s", PROMPT, seeded, world.versions["ov"])])
    noise = [
        GenerateRequest(
            f"n{i}",
            tuple(range(i, i + 9)),
            SamplingParams(max_tokens=6, temperature=1.0),
            world.versions[n] if n else None,
        )
        for i, n in enumerate(["upper", None, "mlp"])
    ]
    crowd = run(
        world.engine(), [*noise, GenerateRequest("s", PROMPT, seeded, world.versions["ov"])]
    )
    assert alone.tokens["s"] == crowd.tokens["s"]


def test_adapter_evicted_and_reloaded_mid_run(world):
    names = ["upper", "mlp", "qk", "ov", "upper", "down"]
    gen = torch.Generator().manual_seed(5)
    requests = [
        GenerateRequest(
            f"e{i}",
            tuple(torch.randint(0, 512, (7,), generator=gen).tolist()),
            greedy(4 + i),
            world.versions[n],
        )
        for i, n in enumerate(names)
    ]
    engine = world.engine(num_slots=2, scheduler=SchedulerConfig(max_loras=2))
    got = run(engine, requests)
    for r, n in zip(requests, names):
        assert got.tokens[r.request_id] == world.reference(
            list(r.prompt_token_ids), n, r.sampling.max_tokens
        )
    assert engine.slab.stats().evictions > 0


def test_unknown_adapter_finishes_with_a_clear_error(world):
    engine = world.engine()
    got = run(engine, [GenerateRequest("u", PROMPT, greedy(3), "ghost@" + "0" * 64),
                       GenerateRequest("ok", PROMPT, greedy(3), world.versions["qk"])])  # fmt: skip
    assert got.done["u"].finish_reason == "error" and "ghost@" in got.done["u"].error
    assert got.done["ok"].finish_reason == "length"  # the others are not held back
    assert engine.blocks.num_free_blocks == engine.config.num_blocks


def test_logprobs_reach_the_stream(world):
    engine, outs = world.engine(), []
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=2)
    engine.submit(GenerateRequest("l", PROMPT, params, world.versions["ov"]), outs.append)
    engine.run_until_idle()
    for out in outs:
        (lp,) = out.logprobs
        assert lp.token_id == out.new_token_ids[0] and len(lp.top) == 2
        assert lp.top[0][0] == lp.token_id and lp.logprob <= 0  # greedy: the best token
