"""SlabTokens: the pool of trainable-token slots, each page's token slot, and the count of
adapters that have any, which a step reads to decide whether to look tokens up at all
(serving/model/llama.py); and the slab's claims on token slots, evicting their LRU holder."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from adapters.format.trainable_tokens import TrainableTokens
from adapters.slab.stats import SlabFull
from adapters.slab.tokens import SlabTokens
from serving.model.adapter_embeddings import own_token_rows
from tests.adapters.slab.helpers import Registry, make_adapter

VOCAB, HIDDEN, PAGES = 32, 4, 8


def adapter(ids: list[int] | None) -> SimpleNamespace:
    """An Adapter's trainable-token part: ids [n] and their rows [n, HIDDEN], or none."""
    if ids is None:
        return SimpleNamespace(tokens=None)
    rows = torch.arange(len(ids) * HIDDEN, dtype=torch.float32).reshape(len(ids), HIDDEN)
    return SimpleNamespace(tokens=SimpleNamespace(ids=torch.tensor(ids), rows=rows + ids[0]))


def tokens(num_slots: int = PAGES) -> SlabTokens:
    return SlabTokens(PAGES, VOCAB, HIDDEN, max_tokens=4, num_slots=num_slots,
                      dtype=torch.float32, device="cpu")  # fmt: skip


def test_a_page_counts_once_marked_and_its_token_slots_rows_are_found_by_id():
    slab = tokens(num_slots=2)
    slab.write(1, adapter([5, 9]))  # a load's write into token slot 1, outside the lock
    assert slab.count == 0 and slab.slots_of(torch.tensor([2])).tolist() == [-1]
    slab.mark(2, 1)  # page 2 (the adapter's slot) now names token slot 1
    assert slab.count == 1
    assert slab.slots_of(torch.tensor([2, 0, -1], dtype=torch.int32)).tolist() == [1, -1, -1]
    assert slab.where[1, 9] == 1 and slab.where[1, 4] == -1 and (slab.where[0] == -1).all()
    assert torch.equal(slab.rows[1, 1], adapter([5, 9]).tokens.rows[1])
    slab.mark(2, None)  # evicted
    slab.write(1, None)
    assert slab.count == 0 and slab.slots_of(torch.tensor([2])).tolist() == [-1]
    assert (slab.where[1] == -1).all() and (slab.ids[1] == -1).all()


def test_the_pool_costs_its_token_slots_not_the_pages():
    pool = tokens(num_slots=2)
    assert pool.where.shape == (2, VOCAB) and pool.rows.shape == (2, 4, HIDDEN)
    assert pool.page_slots.shape == (PAGES,)
    none = SlabTokens(PAGES, VOCAB, HIDDEN, max_tokens=0, dtype=torch.float32, device="cpu")
    assert none.num_slots == 0 and none.where.numel() == 0 and not none.wants(adapter([1]))


def load_at_once(plan: list[SimpleNamespace]) -> SlabTokens:
    """Each plan[page] loaded by a thread of its own, all starting together, each writing its
    token slot (the page's own number here) outside the slab's lock and marking under it,
    as AdapterSlab's loads do."""
    slab, lock, start = tokens(), threading.Lock(), threading.Barrier(len(plan))

    def load(page: int) -> None:
        start.wait()
        token_slot = page if plan[page].tokens is not None else None
        if token_slot is not None:
            slab.write(token_slot, plan[page])
        with lock:
            slab.mark(page, token_slot)

    threads = [threading.Thread(target=load, args=(p,)) for p in range(len(plan))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return slab


def test_concurrent_loads_leave_the_count_of_adapters_with_tokens_exact():
    # A load of an adapter without tokens must never leave the count at 0 beside one that
    # has them, or a step skips that adapter's token rows and its request decodes wrong.
    plan = [adapter([1 + page, 20]) if page % 2 else adapter(None) for page in range(PAGES)]
    for attempt in range(50):
        slab = load_at_once(plan)
        assert slab.count == PAGES // 2, attempt
        held = slab.slots_of(torch.arange(PAGES)).tolist()
        assert held == [p if p % 2 else -1 for p in range(PAGES)]


def test_the_slab_marks_pages_only_under_its_lock(make_slab):
    # Loads on the slab's workers, then loads that evict: every mark must hold the slab's
    # lock, where the count is consistent with every other page's.
    reg = Registry(*(make_adapter(4, seed=i) for i in range(6)))
    slab = make_slab(reg, num_slots=3, prefetch_workers=3, page_rank=16)
    marked = []
    real_mark = slab.tokens.mark

    def mark(page, token_slot):
        marked.append(slab._lock.locked())
        real_mark(page, token_slot)

    slab.tokens.mark = mark
    loads = [slab.prefetch(v) for v in reg.versions[:3]]  # on the slab's workers at once
    assert sorted(load.result(timeout=30) for load in loads) == [0, 1, 2]
    for version in reg.versions[3:]:  # each evicts one of the first three
        slab.acquire(version)
        slab.release(version)
    assert marked and all(marked), marked
    assert slab.tokens.count == 0  # none of these adapters has trainable tokens


def with_tokens(seed: int, ids: list[int]):
    """A rank-4 adapter with trainable tokens ids (rows: seed + the row's index)."""
    rows = seed + torch.arange(len(ids) * 64, dtype=torch.float32).reshape(len(ids), 64)
    return dataclasses.replace(make_adapter(4, seed=seed), tokens=TrainableTokens(
        torch.tensor(ids), rows))  # fmt: skip


def looked_up(slab, slot: int, ids: list[int]) -> torch.Tensor:
    """What a step's embedding lookup gives tokens ids of the adapter in `slot` ([n, 64],
    0 where the adapter has no row of its own)."""
    h = torch.zeros(len(ids), 64)
    slots = torch.full((len(ids),), slot, dtype=torch.int32)
    own_token_rows(h, torch.tensor(ids), slots, slab.tokens)
    return h


def test_a_load_with_tokens_takes_a_token_slot_evicting_its_lru_holder(make_slab):
    a, b, c = with_tokens(1, [3, 7]), with_tokens(2, [7]), with_tokens(3, [9])
    plain = make_adapter(4, seed=4)
    reg = Registry(a, b, c, plain)
    va, vb, vc, vplain = reg.versions
    # Room for 8 one-page adapters, but only 2 token slots.
    slab = make_slab(reg, num_slots=4, token_slots=2)
    slot_a, slot_b = slab.acquire(va), slab.acquire(vb)
    slot_plain = slab.acquire(vplain)  # no tokens: takes no token slot
    with pytest.raises(SlabFull, match="all 2 trainable-token slots"):
        slab.acquire(vc)  # both holders pinned; free pages do not help
    assert set(slab.residents()) == {va, vb, vplain} and slab.tokens.count == 2
    slab.release(va)
    slab.release(vb)  # b is the more recent: a's token slot goes
    slot_c = slab.acquire(vc)
    assert set(slab.residents()) == {vb, vc, vplain} and slab.stats().evictions == 1
    assert slab.tokens.count == 2
    assert torch.equal(looked_up(slab, slot_b, [7, 3])[0], b.tokens.rows[0])
    assert torch.equal(looked_up(slab, slot_c, [9])[0], c.tokens.rows[0])
    assert not looked_up(slab, slot_c, [7, 3]).any()  # a's rows never show under c
    assert not looked_up(slab, slot_a, [3, 7]).any()  # a's old slot: no rows at all
    assert not looked_up(slab, slot_plain, [3, 7, 9]).any()
