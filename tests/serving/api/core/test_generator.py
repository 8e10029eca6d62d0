"""LocalGenerator on a real engine: outputs, early close aborts, a full queue, bad requests,
and the figures a replica reports."""

import asyncio
import dataclasses
import pickle
import time

import pytest

from serving.api.core.generator import LocalGenerator, QueueFull
from serving.engine.figures import engine_snapshot
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.snapshot import EngineSnapshot
from tests.serving.api.served import build_engine
from tests.serving.engine.world import model_tokens


@pytest.fixture
def generator(world):
    gen = LocalGenerator(build_engine(world, world.adapters.__getitem__), max_queue=2)
    yield gen
    gen.close()


def request(rid, n=6, adapter=None, prompt=(5, 6, 7, 8)):
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return GenerateRequest(rid, prompt, params, adapter)


async def collect(gen, req):
    return [out async for out in gen.generate(req)]


def test_outputs_end_with_finished_and_usage(generator, world):
    outs = asyncio.run(collect(generator, request("a", 5, world.versions["upper"])))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == 5 == outs[-1].completion_tokens


def test_closing_early_aborts_in_the_engine(generator, monkeypatch):
    engine = generator.engine
    ran = model_tokens(engine, monkeypatch)

    async def run():
        stream = generator.generate(request("long", n=200))
        first = await anext(stream)
        await stream.aclose()
        # wait on this loop: the engine still delivers to it until the abort is taken
        deadline = time.monotonic() + 10
        while engine.scheduler.has_work() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return first

    first = asyncio.run(run())
    assert not first.finished
    assert not engine.scheduler.has_work()  # aborted, not run to its 200 tokens
    assert sum(ran) < 4 + 100


def test_a_full_queue_raises_queue_full(world):
    engine = build_engine(world, world.adapters.__getitem__)
    gen = LocalGenerator(engine, max_queue=2)
    gen.engine.shutdown()  # nothing is admitted, so every request keeps waiting

    async def run():
        streams = [gen.generate(request(f"q{i}")) for i in range(3)]
        waiting = [asyncio.ensure_future(anext(s)) for s in streams[:2]]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await anext(streams[2])
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for s in streams:
            await s.aclose()
        # the cancelled requests left the queue: another one is queued, not refused
        again = asyncio.ensure_future(anext(gen.generate(request("q3"))))
        await asyncio.sleep(0.05)
        assert not again.done()
        again.cancel()

    asyncio.run(run())


def test_invalid_request_raises_value_error(generator):
    with pytest.raises(ValueError, match="prompt has 200 tokens"):
        asyncio.run(collect(generator, request("big", prompt=tuple(range(200)))))


def test_a_request_is_checked_once(generator, monkeypatch):
    """The generator checks a request before its queue; the engine does not check it again."""
    engine, checks = generator.engine, []
    check = engine.validate
    monkeypatch.setattr(engine, "validate", lambda r: (checks.append(r.request_id), check(r)))
    asyncio.run(collect(generator, request("once", 2)))
    assert checks == ["once"]


def test_max_queue_must_be_positive(world):
    with pytest.raises(ValueError, match="max_queue"):
        LocalGenerator(build_engine(world, world.adapters.__getitem__), max_queue=0)


def test_figures_are_plain_and_picklable(generator, world):
    asyncio.run(collect(generator, request("f", 3, world.versions["mlp"])))
    (figures,) = asyncio.run(generator.figures())
    assert isinstance(figures, EngineSnapshot) and figures.replica == "local"
    assert figures.prefix_queried_tokens >= 4 and figures.num_running == 0
    # num_slots=4 adapters of max_rank 16: eight pages of 8 rows, a slot per page
    assert figures.slab["loads"] == 1 and figures.slab["num_slots"] == figures.slab["pages"] == 8
    assert figures.spec == {}  # speculation is off
    assert pickle.loads(pickle.dumps(figures)) == figures
    assert asyncio.run(generator.ready())
    generator.close()
    assert not asyncio.run(generator.ready())


def test_figures_carry_speculation_per_adapter(world):
    from serving.engine.speculative.config import SpecConfig

    engine = build_engine(world, world.adapters.__getitem__, speculative=SpecConfig(method="ngram"))
    prompt = (5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6)
    salted = dataclasses.replace(
        request("s", 8, world.versions["upper"], prompt), cache_salt="acme"
    )
    engine.submit(salted, lambda out: None)
    engine.run_until_idle()
    figures = engine_snapshot(engine, "r1")
    assert set(figures.spec) == {"upper"}
    counts = figures.spec["upper"]
    assert set(counts) == {"proposed", "accepted", "emitted", "steps"}
    assert counts["proposed"] > 0 and counts["steps"] > 0
    # the same counts under the request's tenant, the only one that sent any
    assert figures.spec_by_tenant == {"acme": {"upper": counts}}
