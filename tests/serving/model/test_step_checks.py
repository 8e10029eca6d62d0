"""A step is checked once and its attention planned once, from the builder's own lists.

With the host lists a step carries (serving.model.step_plan), a base-model forward reads
nothing back from its tensors: on CUDA that is no device sync inside the forward. Counted
here on the CPU by patching the tensor methods that read back (.tolist, .item, bool(),
int(), float()): the same forward with LORASERVE_CHECKS=1 reads back in every layer, so the
count does see reads. The host lists change nothing: logits equal those of the same step
without them, and a bad block table is refused either way, by name.
"""

import dataclasses

import pytest
import torch

from serving.model.step_plan import StepSeq, build_step, plan_step
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.test_llama import ours

BLOCK = 4
READS = ("tolist", "item", "__bool__", "__int__", "__float__")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path, _ = save_tiny("llama", tmp_path_factory.mktemp("tiny"))
    return ours(path)


def mixed_step(vocab: int):
    """A prefill from scratch, a prefill on a cached prefix, two decodes; blocks out of order."""
    gen = torch.Generator().manual_seed(0)
    tokens = lambda n: torch.randint(0, vocab, (n,), generator=gen).tolist()  # noqa: E731
    return build_step([
        StepSeq(tokens(9), 0, [7, 3, 11]),
        StepSeq(tokens(5), 4, [2, 9, 5]),
        StepSeq(tokens(1), 10, [0, 4, 8]),
        StepSeq(tokens(1), 3, [6], logits=1),
    ], BLOCK)  # fmt: skip


def reads_back(model, step, kv, slab=None) -> int:
    counts = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name):
        def read(self, *args, **kwargs):
            counts.append(name)
            return saved[name](self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        with torch.inference_mode():
            model.forward(plan_step(step, kv, slab))
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
    return len(counts)


def test_a_planned_forward_reads_nothing_back(model, monkeypatch):
    kv = model.allocate_kv(num_blocks=16, block_size=BLOCK)
    step = mixed_step(model.config.vocab_size)
    monkeypatch.delenv("LORASERVE_CHECKS", raising=False)
    assert reads_back(model, step, kv) == 0
    monkeypatch.setenv("LORASERVE_CHECKS", "1")  # every layer checks: the count sees it
    assert reads_back(model, step, kv) >= len(model.layers)


def test_host_lists_give_the_same_logits(model, monkeypatch):
    monkeypatch.delenv("LORASERVE_CHECKS", raising=False)
    step = mixed_step(model.config.vocab_size)
    runs = []
    for s in (step, dataclasses.replace(step, host=None)):
        kv = model.allocate_kv(num_blocks=16, block_size=BLOCK)
        with torch.inference_mode():
            runs.append(model.forward(plan_step(s, kv)))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("host", [True, False], ids=["host", "tensors"])
def test_a_block_outside_the_cache_is_refused_by_name(model, monkeypatch, host):
    monkeypatch.delenv("LORASERVE_CHECKS", raising=False)
    kv = model.allocate_kv(num_blocks=16, block_size=BLOCK)
    step = build_step([StepSeq([1, 2, 3, 4, 5], 0, [3, 16])], BLOCK)
    if not host:
        step = dataclasses.replace(step, host=None)
    with pytest.raises(ValueError, match="block_tables: seq 0 names a block outside"):
        model.forward(plan_step(step, kv))
