"""More adapters than the slab holds: a flood of one resident adapter never starves the
others (each request waits at most the scheduler's bound), and ten times the slab's room
in distinct adapters in flight at once all finish, each as it does served alone."""

import pytest

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.adapters.factory import peft_adapter_files
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import ADAPTERS, build_world, model_tokens


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def add_adapters(world, count: int, seed: int) -> list[str]:
    """count rank-2 adapters of their own (PEFT's files, not PEFT's run), loadable by the
    world's engines: their versions."""
    spec = BaseModelSpec.from_dir(world.base_dir)
    versions = []
    for i in range(count):
        adapter = load_adapter(peft_adapter_files(rank=2, seed=seed + i), base=spec)
        version = f"cold{seed + i}@{adapter.digest}"
        world.adapters[version] = adapter
        versions.append(version)
    return versions


class Steps:
    """Drives an engine a model step at a time: `forward()` steps until one step ran the model,
    counting the steps that did not (they wait on adapter loads)."""

    def __init__(self, engine, monkeypatch):
        self.engine, self.got = engine, Collector()
        self.ran = model_tokens(engine, monkeypatch)
        self.num_forward = self.num_idle = 0
        self.submitted, self.first = {}, {}  # request id -> model step it arrived / got a token

    def submit(self, request: GenerateRequest) -> None:
        self.submitted[request.request_id] = self.num_forward
        self.engine.submit(request, self.sink)

    def sink(self, out) -> None:
        self.first.setdefault(out.request_id, self.num_forward)
        self.got.sink(out)

    def forward(self, max_idle: int = 100_000) -> bool:
        """One step that runs the model; False when there is no work left."""
        for _ in range(max_idle):
            before = len(self.ran)
            if not self.engine.step():
                return False
            if len(self.ran) > before:
                self.num_forward += 1
                return True
            self.num_idle += 1
        raise AssertionError(f"{max_idle} steps in a row ran nothing")

    def waits(self) -> dict[str, int]:
        """Model steps from each request's arrival to its first token (the step admitting it)."""
        return {r: self.first[r] - self.submitted[r] for r in self.submitted if r in self.first}


STARVE, HOT_TOKENS, COLD_TOKENS = 4, 3, 2
# The scheduler's bound (serving/engine/scheduler.py): starve_steps, the running hot
# requests' HOT_TOKENS steps, and a step for the load to land; counted to the step that
# admits it, whose token this driver sees.
BOUND = STARVE + HOT_TOKENS + 2


@pytest.mark.slow
def test_a_flood_of_one_hot_adapter_never_starves_200_cold_ones(world, engines, monkeypatch):
    """A new request of the hot adapter every step; one request of each of 200 cold adapters,
    one every 8 steps. The hot adapter fills the slab (rank 16 of max_rank 16, in one
    adapter's room) and is pinned by a running request at every step, so a cold adapter's
    load finds no room until the scheduler stops admitting younger hot requests."""
    cold = add_adapters(world, 200, seed=1000)
    engine = engines(num_slots=1, scheduler=SchedulerConfig(starve_steps=STARVE))
    hot = world.versions["mlp"]
    run = Steps(engine, monkeypatch)
    step = 0
    while step < 8 * len(cold) or len(run.first) < len(run.submitted):
        run.submit(GenerateRequest(f"hot{step}", (1, 2, 3, 4, 5), greedy(HOT_TOKENS), hot))
        if step % 8 == 0 and step // 8 < len(cold):
            i = step // 8
            run.submit(GenerateRequest(f"cold{i}", (7, 8, 9), greedy(COLD_TOKENS), cold[i]))
        run.forward()
        step += 1
        assert step < 20 * len(cold), "the cold requests were not all admitted"
    while run.forward():
        pass
    assert len(run.got.done) == len(run.submitted)
    assert {out.finish_reason for out in run.got.done.values()} == {"length"}
    waits = run.waits()
    over = {r: w for r, w in waits.items() if w > BOUND}
    assert not over, f"waited more than {BOUND} steps: {over}"


def test_ten_times_the_slabs_room_in_distinct_adapters_all_finish_as_alone(
    world, engines, monkeypatch
):
    """Every request at once, each of its own adapter: a full slab (SlabFull) is a wait, never
    an error; every step either runs the model or waits for a load to land; and each output
    is the one its adapter gives alone (transformers + PEFT for the world's adapters, the
    engine serving that one request for the rest)."""
    engine = engines(num_slots=1)
    room = engine.slab.num_slots  # adapters resident at once, at most: one per slot or page
    names = list(ADAPTERS)
    versions = [world.versions[n] for n in names] + add_adapters(world, 10 * room - 6, seed=5000)
    requests = [
        GenerateRequest(f"r{i}", tuple(range(3 + i, 10 + i)), greedy(3 + i % 3), v)
        for i, v in enumerate(versions)
    ]
    run = Steps(engine, monkeypatch)
    for request in requests:
        run.submit(request)
    while run.forward():
        pass
    assert {r: out.finish_reason for r, out in run.got.done.items()} == {
        r.request_id: "length" for r in requests
    }
    stats = engine.slab.stats()
    # Loads start only as the slab has room: none evicts another before its request ran.
    assert len(versions) <= stats.loads <= len(versions) * 3 // 2, stats
    # Idle steps pause until a load lands (or a wake): none spins while loads run.
    assert run.num_idle <= 2 * stats.loads + 10, (run.num_idle, stats.loads)
    alone = engines(num_slots=1)
    for i, request in enumerate(requests):
        prompt, n = list(request.prompt_token_ids), request.sampling.max_tokens
        if i < len(names):
            want = world.reference(prompt, names[i], n)
        else:
            solo = Collector()
            alone.submit(request, solo.sink)
            alone.run_until_idle()
            want = solo.tokens[request.request_id]
        assert run.got.tokens[request.request_id] == want, request.adapter


def test_a_cold_adapters_request_runs_in_the_step_that_first_sees_it(world, engines, monkeypatch):
    """The step starts the waiting requests' loads before it decides and waits (up to
    LOAD_WAIT_S, here long enough for any host) for them: a load that lands joins this step,
    instead of the step after."""
    monkeypatch.setattr("serving.engine.engine.LOAD_WAIT_S", 30.0)
    engine = engines(num_slots=2)
    (cold,) = add_adapters(world, 1, seed=9000)
    run = Steps(engine, monkeypatch)
    run.submit(GenerateRequest("r", (3, 4, 5), greedy(2), cold))
    assert engine.step() and run.ran, "the first step did not run it"
    assert engine.slab.slot_of(cold) is not None
    while run.forward():
        pass
    solo = engines(num_slots=2)
    alone = Collector()
    solo.submit(GenerateRequest("r", (3, 4, 5), greedy(2), cold), alone.sink)
    solo.run_until_idle()
    assert run.got.tokens["r"] == alone.tokens["r"]


def test_a_version_turned_away_for_room_is_forgotten_once_no_request_waits_for_it(
    world, engines, monkeypatch
):
    """A slab kept full by one running adapter turns away every other adapter's load; when
    the requests that waited for those go away (aborted by their clients), the residency keeps
    nothing of them, while the running request and one still waiting carry on."""
    engine = engines(num_slots=1)
    hot = world.versions["mlp"]
    cold = add_adapters(world, 12, seed=7000)
    run = Steps(engine, monkeypatch)
    run.submit(GenerateRequest("hot", (1, 2, 3, 4, 5), greedy(40), hot))
    run.forward()  # hot runs and holds the slab's only room
    for i, version in enumerate(cold):
        run.submit(GenerateRequest(f"cold{i}", (7, 8, 9), greedy(2), version))
    run.forward()
    assert engine.residency.num_short() == len(cold)
    for i in range(1, len(cold)):
        engine.abort(f"cold{i}")
    run.forward()
    assert engine.residency.num_short() == 1  # cold0's request still waits for room
    while run.forward():
        pass
    assert {r: out.finish_reason for r, out in run.got.done.items()} == {
        "hot": "length", "cold0": "length", **{f"cold{i}": "abort" for i in range(1, len(cold))}
    }  # fmt: skip
    assert engine.residency.num_short() == 0
