"""One request's own fault fails that request only; every other row goes on bit-identical.

The faults come from the request's own data: an adapter whose weights are not finite (in the
plain and in the speculative paths), sampling parameters at the edge of float range, a stop
string check that raises, a prompt whose rows make the batched forward raise.
"""

import dataclasses

import pytest
import torch

from adapters.format.lora_modules import LoraModule
from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = build_world(tmp_path_factory.mktemp("isolation"))
    # A broken adapter that reached the slab: NaN in its B, so its rows' logits are NaN.
    good = world.adapters[world.versions["upper"]]
    modules = {key: LoraModule(m.layer, m.module, m.a, torch.full_like(m.b, float("nan")))
               for key, m in good.modules.items()}  # fmt: skip
    broken = dataclasses.replace(good, modules=modules, digest="0" * 64)
    world.adapters["broken@" + "0" * 64] = broken
    world.versions["broken"] = "broken@" + "0" * 64
    return world


def run(engine, requests):
    """Submit every (request id, prompt, params, adapter name) at once; their outputs."""
    c = Collector()
    for rid, prompt, params, name in requests:
        version = WORLD["versions"][name] if name else None
        engine.submit(GenerateRequest(rid, tuple(prompt), params, version), c.sink)
    engine.run_until_idle()
    return c


WORLD = {}


@pytest.fixture(autouse=True)
def _versions(world):
    WORLD["versions"] = world.versions


INNOCENT = ("innocent", PROMPT, greedy(12), "rot13")


def alone(engine_factory):
    c = run(engine_factory(), [INNOCENT])
    return c.tokens["innocent"]


def engine_for(world, mode):
    """plain; ngram (prompt lookup); draft (the base as its own draft: every step verifies k + 1)."""
    if mode == "plain":
        return world.engine()
    if mode == "ngram":
        return spec_engine(world, "ngram", k=3, ngram_min=1)
    return spec_engine(world, "draft_model", draft="same", k=3)


MODES = ["plain", "ngram", "draft"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_an_adapter_with_nan_weights_fails_its_request_only(world, mode, temperature):
    factory = lambda: engine_for(world, mode)  # noqa: E731
    want = alone(factory)
    assert want == world.reference(PROMPT, "rot13", 12)
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=3, ignore_eos=True)
    c = run(factory(), [INNOCENT, ("bad", [1, 2, 1, 2, 1, 2], params, "broken"),
                        ("base", PROMPT, greedy(12), None)])  # fmt: skip
    assert c.tokens["innocent"] == want
    assert c.tokens["base"] == world.reference(PROMPT, None, 12)
    bad = c.done["bad"]
    assert bad.finish_reason == "error" and "non-finite" in bad.error and bad.own_fault


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 1e-40},
        {"temperature": 5e-324},
        {"temperature": 1e-5, "repetition_penalty": 1e-40},
        {"temperature": 0.5, "repetition_penalty": 1e-40},
        {"temperature": 0.5, "repetition_penalty": 5e-324, "top_p": 1e-9},
        {"temperature": 2.0, "frequency_penalty": 1e38, "presence_penalty": -1e38},
        {"temperature": 1.0, "top_k": 1, "top_p": 5e-324},
    ],
)
def test_extreme_sampling_fields_never_harm_the_innocent(world, fields):
    want = alone(world.engine)
    params = SamplingParams(max_tokens=6, ignore_eos=True, seed=1, **fields)
    c = run(world.engine(), [INNOCENT, ("wild", [3, 4, 5], params, "mlp")])
    assert c.tokens["innocent"] == want
    assert c.done["wild"].finish_reason == "length"  # each of these samples some token


@pytest.mark.parametrize("mode", ["plain", "draft"])
def test_non_finite_logits_in_a_later_step_fail_that_request_only(world, mode, monkeypatch):
    """NaN in one request's decode rows (its verification rows when speculating) fails it."""
    engine = engine_for(world, mode)
    want = alone(lambda: engine_for(world, mode))
    slot = {}
    forward = engine.model.forward
    seen_rows = []

    def nan_after_prefill(plan):
        logits = forward(plan)
        inputs = plan.inputs
        rows = inputs.logits_indices
        hit = (inputs.adapter_slots[rows] == slot["bad"]) & (inputs.positions[rows] >= 6)
        if bool(hit.any()):
            seen_rows.append(int(hit.sum()))
            logits[hit] = float("nan")
        return logits

    monkeypatch.setattr(engine.model, "forward", nan_after_prefill)
    version = world.versions["mlp"]
    engine.slab.acquire(version)  # resident, so its slot is known before the run
    slot["bad"] = engine.slab.slot_of(version)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    c = run(engine, [INNOCENT, ("bad", [1, 2, 1, 2, 1, 2], params, "mlp")])
    assert c.tokens["innocent"] == want
    assert c.done["bad"].finish_reason == "error" and "non-finite" in c.done["bad"].error
    assert len(c.tokens["bad"]) >= 1  # its prefill token came out before the fault
    assert seen_rows == [1] if mode == "plain" else max(seen_rows) == 4  # a verification


def test_temperatures_below_the_greedy_cut_decode_greedily(world):
    greedy_tokens = run(world.engine(), [INNOCENT]).tokens["innocent"]
    tiny = SamplingParams(max_tokens=12, temperature=9e-6, ignore_eos=True)  # no seed: unused
    c = run(world.engine(), [("tiny", PROMPT, tiny, "rot13")])
    assert c.tokens["tiny"] == greedy_tokens


def test_a_raising_stop_check_fails_its_request_only(world, monkeypatch):
    want = alone(world.engine)
    engine = world.engine()
    from serving.engine import stopping

    real = stopping.StopChecker.add

    def add(self, token_id, n):
        if "boom" in self.params.stop:
            raise RuntimeError("stop check fault")
        return real(self, token_id, n)

    monkeypatch.setattr(stopping.StopChecker, "add", add)
    params = SamplingParams(max_tokens=5, temperature=0.0, stop=("boom",))
    c = run(engine, [INNOCENT, ("stopper", [9, 8, 7], params, "qk")])
    assert c.tokens["innocent"] == want
    assert c.done["stopper"].finish_reason == "error"
    assert "internal error: RuntimeError" in c.done["stopper"].error
    assert not c.done["stopper"].own_fault  # a bug of ours, whatever data set it off


def test_a_forward_that_raises_on_one_row_fails_that_request_only(world, monkeypatch):
    """The batched forward raises whenever the poisoned token is in it: its request is blamed."""
    want = alone(world.engine)
    engine = world.engine()
    forward = engine.model.forward
    poison = 411

    def flaky(plan):
        if bool((plan.inputs.token_ids == poison).any()):
            raise IndexError("row fault")
        return forward(plan)

    monkeypatch.setattr(engine.model, "forward", flaky)
    c = run(engine, [INNOCENT, ("poisoned", [1, poison, 2], greedy(4), "mlp"),
                     ("base", PROMPT, greedy(12), None)])  # fmt: skip
    assert c.tokens["innocent"] == want
    assert c.tokens["base"] == world.reference(PROMPT, None, 12)
    assert c.done["poisoned"].finish_reason == "error"
    assert "IndexError" in c.done["poisoned"].error


def test_prompt_ids_outside_the_vocabulary_are_refused_at_submit(world):
    engine = world.engine()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit(GenerateRequest("oov", (1, 512), greedy(2)), lambda out: None)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit(GenerateRequest("neg", (-1,), greedy(2)), lambda out: None)
