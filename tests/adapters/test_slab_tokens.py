"""SlabTokens: a slot's trainable-token rows, and the count of slots that have any, which a
step reads to decide whether to look tokens up at all (serving/model/llama.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from adapters.slab_tokens import SlabTokens
from tests.adapters.slab_helpers import Registry, make_adapter

VOCAB, HIDDEN, SLOTS = 32, 4, 8


def adapter(ids: list[int] | None) -> SimpleNamespace:
    """An Adapter's trainable-token part: ids [n] and their rows [n, HIDDEN], or none."""
    if ids is None:
        return SimpleNamespace(tokens=None)
    rows = torch.arange(len(ids) * HIDDEN, dtype=torch.float32).reshape(len(ids), HIDDEN)
    return SimpleNamespace(tokens=SimpleNamespace(ids=torch.tensor(ids), rows=rows))


def tokens() -> SlabTokens:
    return SlabTokens(SLOTS, VOCAB, HIDDEN, max_tokens=4, dtype=torch.float32, device="cpu")


def test_a_slot_counts_once_marked_and_its_rows_are_found_by_id():
    slab = tokens()
    slab.write(2, adapter([5, 9]))  # a load's write, outside the slab's lock
    assert slab.count == 0 and not slab.has[2]  # not in use until the load is done
    slab.mark(2, adapter([5, 9]))
    assert slab.count == 1 and bool(slab.has[2])
    assert slab.where[2, 9] == 1 and slab.where[2, 4] == -1
    assert torch.equal(slab.rows[2, 1], adapter([5, 9]).tokens.rows[1])
    slab.mark(2, None)  # evicted
    slab.write(2, None)
    assert slab.count == 0 and not slab.has[2]
    assert (slab.where[2] == -1).all() and (slab.ids[2] == -1).all()


def load_at_once(plan: list[SimpleNamespace]) -> SlabTokens:
    """Each plan[slot] loaded into its slot by a thread of its own, all starting together,
    each writing outside the slab's lock and marking under it, as AdapterSlab's loads do."""
    slab, lock, start = tokens(), threading.Lock(), threading.Barrier(len(plan))

    def load(slot: int) -> None:
        start.wait()
        slab.write(slot, plan[slot])
        with lock:
            slab.mark(slot, plan[slot])

    threads = [threading.Thread(target=load, args=(s,)) for s in range(len(plan))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return slab


def test_concurrent_loads_leave_the_count_of_slots_with_tokens_exact():
    # A load of an adapter without tokens must never leave the count at 0 beside one that
    # has them, or a step skips that adapter's token rows and its request decodes wrong.
    plan = [adapter([1 + slot, 20]) if slot % 2 else adapter(None) for slot in range(SLOTS)]
    for attempt in range(50):
        slab = load_at_once(plan)
        assert slab.count == SLOTS // 2, attempt
        assert slab.has.tolist() == [bool(s % 2) for s in range(SLOTS)]


def test_the_slab_marks_slots_only_under_its_lock(make_slab):
    # Loads on the slab's workers, then loads that evict: every mark must hold the slab's
    # lock, where the count is consistent with every other slot's.
    reg = Registry(*(make_adapter(4, seed=i) for i in range(6)))
    slab = make_slab(reg, num_slots=3, prefetch_workers=3)
    marked = []
    real_mark = slab.tokens.mark

    def mark(slot, adapter):
        marked.append(slab._lock.locked())
        real_mark(slot, adapter)

    slab.tokens.mark = mark
    loads = [slab.prefetch(v) for v in reg.versions[:3]]  # on the slab's workers at once
    assert sorted(load.result(timeout=30) for load in loads) == [0, 1, 2]
    for version in reg.versions[3:]:  # each evicts one of the first three
        slab.acquire(version)
        slab.release(version)
    assert marked and all(marked), marked
    assert slab.tokens.count == 0  # none of these adapters has trainable tokens
