"""A step with adapters reads nothing back from its tensors either (see test_step_checks).

Every LoRA variant the slab serves is in the batch: plain adapters of several ranks, a
rank_pattern, lora_B biases, DoRA, embedding and LM-head LoRA, and base-only rows. Their
segments, runs, scales, module ranks and extra rows all come from the host lists the step
and the slab keep, so the forward makes no read-back: on CUDA, no device sync. The same
step through the checked public ops (LORASERVE_CHECKS=1) reads back in every layer and
gives the same logits, as does the step without its host lists.
"""

import dataclasses

import pytest
import torch

from serving.model.step_plan import plan_step
from tests.serving.model.steps import BlockPool, Seq, step_for
from tests.serving.model.test_lora_variants import build
from tests.serving.model.test_step_checks import reads_back

BLOCK = 4
ROWS = ["dora", "__base__", "plain", "outer", "bias", "patterns", "dora_rslora", "plain"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, _, slab, slots, _ = build(tmp_path_factory.mktemp("reads"), fp8=False)
    yield model, slab, slots
    slab.close()


def steps(slots):
    """A mixed prefill (one prompt long enough to run in place), then a decode of every row."""
    gen = torch.Generator().manual_seed(0)
    seqs = [
        Seq(torch.randint(0, 100, (40 if i == 2 else 5,), generator=gen).tolist(),
            slot=slots.get(name, -1))
        for i, name in enumerate(ROWS)
    ]  # fmt: skip
    pool = BlockPool(64)
    prefill = step_for(seqs, BLOCK, pool, all_logits=False)
    for s in seqs:
        s.tokens.append(7)
    return prefill, step_for(seqs, BLOCK, pool, all_logits=False)


def run(model, slab, step, kv):
    with torch.inference_mode():
        return model.forward(plan_step(step, kv, slab))


def test_a_lora_step_reads_nothing_back(setup, monkeypatch):
    model, slab, slots = setup
    monkeypatch.delenv("LORASERVE_CHECKS", raising=False)
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    prefill, decode = steps(slots)
    for step in (prefill, decode):
        assert step.host.adapter_slots.count(-1) < len(step.host.adapter_slots)
        counted = reads_back(model, step, kv, slab)
        assert counted == 0
    monkeypatch.setenv("LORASERVE_CHECKS", "1")  # the count sees reads when there are some
    assert reads_back(model, decode, kv, slab) >= len(model.layers)


@pytest.mark.parametrize("variant", ["checked", "no host lists"])
def test_the_planned_ops_give_what_the_checked_ops_give(setup, monkeypatch, variant):
    model, slab, slots = setup
    logits = {}
    for label in ("planned", variant):
        if label == "checked":
            monkeypatch.setenv("LORASERVE_CHECKS", "1")
        else:
            monkeypatch.delenv("LORASERVE_CHECKS", raising=False)
        kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
        out = []
        for step in steps(slots):
            if label == "no host lists":
                step = dataclasses.replace(step, host=None)
            out.append(run(model, slab, step, kv))
        logits[label] = out
    for got, want in zip(logits["planned"], logits[variant]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
