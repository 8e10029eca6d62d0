"""A fault in one step fails the requests in flight, never the step thread; bad seeds are refused."""

import asyncio
import time

import pytest

from adapters.errors import AdapterError
from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.test_engine_peft import greedy
from tests.serving.engine.world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("faults"))


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(world, monkeypatch):
    engine = world.engine()
    forward = engine.model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device fault")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", flaky)
    engine.start()
    try:

        async def run(rid):
            return [o async for o in engine.add_request(GenerateRequest(rid, (5, 6, 7), greedy(3)))]

        first = asyncio.run(run("a"))
        second = asyncio.run(run("b"))
    finally:
        engine.shutdown()
    assert first[-1].finish_reason == "error" and "RuntimeError" in first[-1].error
    assert second[-1].finish_reason == "length" and second[-1].completion_tokens == 3


def test_a_closed_event_loop_only_aborts_its_request(world):
    engine = world.engine()
    engine.start()
    try:

        async def leave_early():
            stream = engine.add_request(GenerateRequest("gone", (5, 6, 7), greedy(50)))
            await stream.__anext__()  # the loop closes with the stream still open

        asyncio.run(leave_early())
        time.sleep(0.2)

        async def run():
            return [o async for o in engine.add_request(GenerateRequest("next", (1, 2), greedy(2)))]

        assert asyncio.run(run())[-1].completion_tokens == 2
    finally:
        engine.shutdown()


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_out_of_range_seeds_are_refused(world, seed):
    engine = world.engine()
    with pytest.raises(ValueError, match="seed"):
        engine.submit(GenerateRequest("s", (1, 2), SamplingParams(seed=seed)), lambda out: None)


def test_a_slow_reader_gets_merged_increments_with_the_same_tokens(world):
    """Outputs that pile up while the reader is away arrive as one increment."""
    engine = world.engine()
    engine.start()
    try:

        async def slow():
            outs = []
            async for out in engine.add_request(GenerateRequest("slow", (5, 6, 7), greedy(20))):
                outs.append(out)
                await asyncio.sleep(0.05)  # the engine runs ahead meanwhile
            return outs

        outs = asyncio.run(slow())
    finally:
        engine.shutdown()
    tokens = [t for o in outs for t in o.new_token_ids]
    assert tokens == world.reference([5, 6, 7], None, 20)
    assert len(outs) < 20 and outs[-1].completion_tokens == 20
    assert "".join(o.new_text for o in outs) == world.tokenizer.decode(tokens)


def test_an_adapter_that_does_not_fit_fails_its_requests_as_their_own_fault(world):
    """A version the replica's loader refuses (published without the base model's checks, its
    shapes do not fit, so the registry's load raises): its requests fail as the callers' doing
    (a 400, not a 500), and a request on another adapter beside it is served."""
    misfit = f"misfit@{'1' * 64}"

    class Registry(
        dict
    ):  # loads as serving.engine.from_config's loader does: checked against the base
        def __getitem__(self, version):
            if version == misfit:
                raise AdapterError("layer 0 down_proj: shapes lora_A (8, 255) do not fit")
            return super().__getitem__(version)

    adapters, world.adapters = world.adapters, Registry(world.adapters)
    try:
        engine = world.engine()
    finally:
        world.adapters = adapters
    done = {}

    def sink(out):
        if out.finished:
            done[out.request_id] = out

    engine.submit(GenerateRequest("misfit", (5, 6, 7), greedy(3), misfit), sink)
    engine.submit(GenerateRequest("good", (5, 6, 7), greedy(3), world.versions["upper"]), sink)
    engine.run_until_idle()
    out = done["misfit"]
    assert out.finish_reason == "error" and out.own_fault, out
    assert "down_proj" in out.error
    assert done["good"].finish_reason == "length"
