"""SlabRanks: each module's rank per slot, and which slots use the embedding's or LM head's
LoRA, which a step reads to decide whether to run those at all (serving/model/llama.py)."""

from __future__ import annotations

from adapters.format.tensor_names import OUTER_LAYER
from adapters.slab.ranks import SlabRanks
from tests.adapters.slab.helpers import Registry, make_adapter

MODULES, OUTER, SLOTS = ("q_proj", "v_proj"), ("embed_tokens", "lm_head"), 4


def ranks() -> SlabRanks:
    return SlabRanks(2, MODULES, OUTER, SLOTS, "cpu")


def test_a_slot_uses_an_outer_module_only_once_marked():
    table = ranks()
    table.set((OUTER_LAYER, "lm_head"), 1, 8)  # a load's write, outside the slab's lock
    table.set((0, "q_proj"), 1, 8)
    assert not table.serves_outer("lm_head")  # the load is not done: no step may run it
    assert table.host_of(0, ["q_proj"]) == [[0, 8, 0, 0]]  # the kernels' tables are written
    table.mark(1)
    assert table.serves_outer("lm_head") and not table.serves_outer("embed_tokens")
    assert table.of(OUTER_LAYER, ["embed_tokens", "lm_head"]).tolist() == [[0] * 4, [0, 8, 0, 0]]


def test_a_slot_refilled_without_the_module_and_a_cleared_slot_stop_using_it():
    table = ranks()
    for slot in (0, 2):
        table.set((OUTER_LAYER, "embed_tokens"), slot, 4)
        table.mark(slot)
    table.clear(0)  # evicted
    assert table.serves_outer("embed_tokens")  # slot 2 still does
    table.set((OUTER_LAYER, "embed_tokens"), 2, 0)  # a new tenant without it
    assert table.serves_outer("embed_tokens")  # until that load is published
    table.mark(2)
    assert not table.serves_outer("embed_tokens")


def test_the_slab_marks_outer_use_only_under_its_lock(make_slab):
    reg = Registry(*(make_adapter(4, seed=i) for i in range(5)))
    slab = make_slab(reg, num_slots=2, prefetch_workers=2)
    marked = []
    real_mark = slab.stacks.ranks.mark

    def mark(slot):
        marked.append(slab._lock.locked())
        real_mark(slot)

    slab.stacks.ranks.mark = mark
    loads = [slab.prefetch(v) for v in reg.versions[:2]]  # on the slab's workers at once
    assert sorted(load.result(timeout=30) for load in loads) == [0, 1]
    for version in reg.versions[2:]:  # each evicts one of the first two
        slab.acquire(version)
        slab.release(version)
    assert len(marked) == 5 and all(marked), marked
