"""(a) A staggered mixed batch of 18 requests (6 adapters and base-only) against transformers +
PEFT generating each request alone, token for token; plus the async stream and bad requests."""

import asyncio

import pytest
import torch

from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.world import ADAPTERS, build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def greedy(max_tokens):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


class Collector:
    def __init__(self):
        self.tokens, self.done = {}, {}

    def sink(self, out):
        self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            self.done[out.request_id] = out


def test_mixed_batch_matches_peft_token_for_token(world):
    engine = world.engine(
        scheduler=__import__("serving.engine.scheduler", fromlist=["x"]).SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=40, max_loras=8
        )
    )
    names = [*ADAPTERS, None, None] * 2 + ["upper", None]  # 18 requests: 6 adapters x 2, 6 base
    gen = torch.Generator().manual_seed(0)
    requests = []
    for i, name in enumerate(names):
        prompt = torch.randint(
            0, 512, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen
        )
        max_new = int(torch.randint(1, 12, (1,), generator=gen))
        version = world.versions[name] if name else None
        requests.append(
            (GenerateRequest(f"r{i}", tuple(prompt.tolist()), greedy(max_new), version), name)
        )
    got = Collector()
    for i, (request, _) in enumerate(requests):  # arrivals staggered across steps
        engine.submit(request, got.sink)
        if i % 3 == 2:
            engine.step()
            engine.step()
    engine.run_until_idle()
    assert len(got.done) == len(requests)
    for request, name in requests:
        want = world.reference(list(request.prompt_token_ids), name, request.sampling.max_tokens)
        assert got.tokens[request.request_id] == want, (request.request_id, name)
        assert got.done[request.request_id].finish_reason == "length"


def test_async_stream_and_usage(world):
    engine = world.engine()
    engine.start()
    try:

        async def run():
            request = GenerateRequest("s", (5, 6, 7, 8, 9), greedy(6), world.versions["mlp"])
            return [out async for out in engine.add_request(request)]

        outs = asyncio.run(run())
    finally:
        engine.shutdown()
    assert outs[-1].finished and outs[-1].completion_tokens == 6 and outs[-1].prompt_tokens == 5
    tokens = [t for o in outs for t in o.new_token_ids]
    assert tokens == world.reference([5, 6, 7, 8, 9], "mlp", 6)
    assert "".join(o.new_text for o in outs) == world.tokenizer.decode(tokens)


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ((1,) * 256, greedy(4), "the prompt has 256 tokens; the model serves at most 256"),
        ((1, 2), greedy(-1), "max_tokens must be at least 0"),
        ((), greedy(4), "the prompt is empty"),
    ],
)
def test_bad_requests(world, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        world.engine().submit(GenerateRequest("x", prompt, params), lambda out: None)


def test_the_models_context_caps_the_length(world):
    engine = world.engine()
    engine.model.max_context = 40  # as a model of max_position_embeddings 40 would have
    engine = type(engine)(engine.model, engine.tokenizer, engine.config, slab=engine.slab)
    with pytest.raises(ValueError, match="the prompt has 40 tokens; the model serves at most 40"):
        engine.submit(GenerateRequest("w", tuple(range(1, 41)), greedy(2)), lambda out: None)
    got = Collector()
    engine.submit(GenerateRequest("v", tuple(range(1, 37)), greedy(100)), got.sink)
    engine.run_until_idle()
    assert len(got.tokens["v"]) == 4


def test_max_tokens_is_capped_to_the_model_length(world):
    engine, got = world.engine(max_model_len=32), Collector()
    engine.submit(GenerateRequest("c", tuple(range(1, 29)), greedy(100)), got.sink)
    engine.run_until_idle()
    assert len(got.tokens["c"]) == 4 and got.done["c"].finish_reason == "length"
