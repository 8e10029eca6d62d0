"""The slab's pages: what they cost and how many a budget holds, reuse of freed pages,
fragmentation, and a poisoned slab of mixed ranks through every kernel path against the
float64 oracle (where a load goes, as tables: test_slab_alloc.py)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from adapters.slab.pages import page_costs
from adapters.slab.stats import SlabFull
from kernels import (
    build_segments,
    cpu_plan,
    lora_apply_planned,
    lora_expand,
    lora_native,
    lora_shrink,
)
from tests.adapters.factory import TINY_SPEC
from tests.adapters.slab.helpers import (
    ALL,
    ATTN,
    Registry,
    assert_holds,
    cycle,
    device_bytes,
    make_adapter,
)


@pytest.mark.parametrize(
    "kw",
    [
        {"max_rank": 64},
        {"max_rank": 16, "page_rank": 4, "dtype": torch.bfloat16, "embeddings": True},
        {"max_rank": 8, "page_rank": 8, "modules": ATTN, "max_tokens": 0},
        {"max_rank": 24, "token_slots": 3, "max_tokens": 5},
    ],
)
def test_slab_bytes_hold_the_pages_page_costs_counts(make_slab, kw):
    costs = page_costs(TINY_SPEC, **kw)
    for pages in (costs.pages_of(kw["max_rank"]), 13):
        budget = costs.bytes_for(pages)
        slab = make_slab(Registry(), slab_bytes=budget, num_slots=None, **kw)
        assert slab.num_pages == slab.num_slots == pages
        assert device_bytes(slab) == budget  # every byte the slab allocated, and no more
        s = slab.stats()
        assert (s.pages, s.page_rank, s.slab_bytes) == (
            pages,
            costs.page_rank,
            pages * costs.page_bytes,
        )
        assert make_slab(Registry(), slab_bytes=budget + costs.page_bytes - 1, num_slots=None,
                         **kw).num_pages == pages  # fmt: skip


def test_a_budget_below_one_max_rank_adapter_is_refused_naming_the_bytes(make_slab):
    costs = page_costs(TINY_SPEC, max_rank=64)
    short = costs.bytes_for(8) - 1  # seven pages: a rank-64 adapter needs eight
    with pytest.raises(ValueError, match=rf"slab_bytes {short} hold 7 pages .* needs 8"):
        make_slab(Registry(), slab_bytes=short, num_slots=None, max_rank=64)
    with pytest.raises(ValueError, match="exactly one of num_slots and slab_bytes"):
        make_slab(Registry(), slab_bytes=costs.bytes_for(8), num_slots=2, max_rank=64)
    with pytest.raises(ValueError, match="exactly one of num_slots and slab_bytes"):
        make_slab(Registry(), num_slots=None, max_rank=64)


def test_rank_8_takes_an_eighth_of_what_rank_64_takes(make_slab):
    reg = Registry(make_adapter(8, ALL, seed=1), make_adapter(64, ALL, seed=2))
    small, big = reg.versions
    slab = make_slab(reg, num_slots=2, max_rank=64)  # legacy: room for two rank-64s
    assert (slab.num_pages, slab.page_rank) == (16, 8)
    # an adapter of trainable tokens only (rank 0) still holds its slot's page
    assert [slab.costs.pages_of(r) for r in (0, 1, 8, 9, 64)] == [1, 1, 1, 2, 8]
    page = slab.costs.page_bytes
    cycle(slab, small)
    assert (slab.stats().pages_used, slab.stats().slab_used_bytes) == (1, page)
    cycle(slab, big)
    assert (slab.stats().pages_used, slab.stats().slab_used_bytes) == (9, 9 * page)
    assert slab.residents() == {small: 0, big: 1}


def test_legacy_num_slots_holds_that_many_max_rank_adapters(make_slab):
    reg = Registry(*(make_adapter(64, ATTN, seed=i) for i in range(4)))
    slab = make_slab(reg, num_slots=3, max_rank=64)
    assert [slab.acquire(v) for v in reg.versions[:3]] == [0, 8, 16]
    with pytest.raises(SlabFull):
        slab.acquire(reg.versions[3])
    slab.release(reg.versions[1])
    assert slab.acquire(reg.versions[3]) == 8 and slab.stats().evictions == 1
    assert_holds(slab, 8, reg.adapters[reg.versions[3]])


def test_a_freed_page_is_reused_and_its_old_rows_never_show(make_slab):
    old = make_adapter(16, ALL, seed=1)  # every module, every row of both pages
    first, second = make_adapter(8, ("q_proj", "v_proj"), seed=2), make_adapter(8, ATTN, seed=3)
    reg = Registry(old, first, second)
    v_old, v_first, v_second = reg.versions
    slab = make_slab(reg, num_slots=1)  # two pages of 8
    cycle(slab, v_old)
    assert slab.acquire(v_first) == 0  # evicts the rank 16 (one run of one page: page 0)
    assert slab.acquire(v_second) == 1  # its second page, free now
    assert slab.residents() == {v_first: 0, v_second: 1} and slab.stats().evictions == 1
    assert_holds(slab, 0, first)  # untargeted modules' rows: zero, not the old adapter's
    assert_holds(slab, 1, second)
    slots = torch.tensor([0, 1, -1, 1, 0], dtype=torch.int32)
    for layer in range(TINY_SPEC.num_layers):
        for m in ALL:
            x = torch.randn(5, TINY_SPEC.shapes[m][0])
            got = run_slab(slab, layer, m, x, slots)
            want = oracle(x, slots.tolist(), {0: first, 1: second}, layer, m)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_a_page_a_partial_tenant_wrote_is_zeroed_for_its_next_tenant(make_slab):
    # A load zeroes only the rows a tenant may have left: the rank-12 one writes every
    # module's rows 0-11 over pages 1-2, page 2 in part; page 2's next tenant targets o_proj
    # alone, so every other module's rows there must be zeroed, not left as they were.
    pinned, old = make_adapter(8, ("v_proj",), seed=1), make_adapter(12, ALL, seed=2)
    filler, first = make_adapter(8, ("k_proj",), seed=3), make_adapter(8, ("q_proj",), seed=4)
    second = make_adapter(8, ("o_proj",), seed=5)
    reg = Registry(pinned, old, filler, first, second)
    v_pinned, v_old, v_filler, v_first, v_second = reg.versions
    slab = make_slab(reg, num_slots=2, max_rank=16)  # four pages of 8
    assert slab.acquire(v_pinned) == 0
    cycle(slab, v_old, v_filler)  # pages 1-2, then 3
    assert slab.acquire(v_first) == 1  # the old one is the least recent: it goes
    assert slab.acquire(v_second) == 2  # where its rows 8-11 were
    assert slab.residents().keys() == {v_pinned, v_filler, v_first, v_second}
    for v, slot in slab.residents().items():
        assert_holds(slab, slot, reg.adapters[v])
    slots = torch.tensor([2, 1, 0, -1, 2], dtype=torch.int32)
    held = {0: pinned, 1: first, 2: second}
    for layer in range(TINY_SPEC.num_layers):
        for m in ALL:
            x = torch.randn(5, TINY_SPEC.shapes[m][0])
            got = run_slab(slab, layer, m, x, slots)
            want = oracle(x, slots.tolist(), held, layer, m)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_a_fragmented_slab_evicts_the_lru_run_for_a_rank_64_and_nothing_else(make_slab):
    halves = [make_adapter(16, ("q_proj",), seed=i) for i in range(12)]
    threes = [make_adapter(24, ("k_proj",), seed=20 + i) for i in range(2)]
    wholes = [make_adapter(64, ("v_proj",), seed=30 + i) for i in range(2)]
    reg = Registry(*halves, *threes, *wholes)
    h, (y0, y1), (z, w) = reg.versions[:12], reg.versions[12:14], reg.versions[14:]
    slab = make_slab(reg, num_slots=3, max_rank=64)  # 24 pages of 8
    cycle(slab, *h)  # h[i] at pages 2i, 2i + 1; h[0] the least recently used
    assert slab.acquire(y0) == 0  # no free run of 3: h0 and h1 go; page 3 is left free
    cycle(slab, h[2])  # h[2] most recent now: the next three pages go elsewhere
    assert slab.acquire(y1) == 6  # 6-8 holds h3, h4, the least recent run; page 9 left free
    # Pinned y0 (0-2) and y1 (6-8); free pages 3 and 9; LRU h5 .. h11, h2.
    kept = {v: slab.slot_of(v) for v in (h[2], h[9], h[10], h[11])}
    assert slab.acquire(z) == 9  # 9-16: h5 .. h8 the least recent run (h8 reaches page 17)
    assert slab.stats().evictions == 8
    residents = slab.residents()
    assert set(residents) == {y0, y1, z, *kept} and all(residents[v] == s for v, s in kept.items())
    for v, slot in residents.items():
        assert_holds(slab, slot, reg.adapters[v])
    # Every run of 8 now touches a pin (0-2, 6-8, 9-16): full, and nothing moves.
    with pytest.raises(SlabFull, match="needs 8 contiguous pages"):
        slab.acquire(w)
    assert slab.residents() == residents and slab.stats().evictions == 8
    assert slab.stats().pages_used == 3 + 3 + 8 + 2 * len(kept)


# -- a poisoned slab of mixed ranks through every kernel path ---------------------------


def oracle(x, slots: list[int], adapters: dict, layer: int, module: str) -> torch.Tensor:
    """scale * x @ a.T @ b.T per token, from the adapters themselves, in float64."""
    fan_out = TINY_SPEC.shapes[module][1]
    want = torch.zeros(len(slots), fan_out, dtype=torch.float64)
    for t, slot in enumerate(slots):
        mod = adapters[slot].modules.get((layer, module)) if slot >= 0 else None
        if mod is not None:
            a, b = mod.a.double(), mod.b.double()
            want[t] = adapters[slot].scale * (x[t].double() @ a.T @ b.T)
    return want


def run_slab(slab, layer, module, x, slots, host=False) -> torch.Tensor:
    """The slab's update for tokens in slots, through the checked ops (or, with host,
    lora_apply_planned as a model step runs it)."""
    a, b = slab.lora_a(layer, module), slab.lora_b(layer, module)
    y = torch.zeros(x.shape[0], b.shape[2])
    if host:
        segments = build_segments(slots, slab.ranks, (slots.tolist(), slab.host_ranks))
        lora_apply_planned(x, (a,), (b,), y, segments, slab.scales, slab.max_rank,
                           host_scales=slab.host_scales)  # fmt: skip
        return y
    segments = build_segments(slots, slab.ranks)
    t = lora_shrink(x, a, torch.zeros(x.shape[0], slab.max_rank), segments)
    return lora_expand(t, b, y, segments, slab.scales)


def poison(slab) -> None:
    """NaN into every row of every stack that no resident adapter's rank covers."""
    held = torch.zeros((slab.num_pages - 1) * slab.page_rank + slab.max_rank, dtype=torch.bool)
    for slot in slab.residents().values():
        start = slot * slab.page_rank
        held[start : start + slab.host_ranks[slot]] = True
    for stack in (*slab.stacks.a.values(), *slab.stacks.b.values()):
        rows = stack.as_strided((held.numel(), stack.shape[2]), (stack.stride(1), 1))
        rows[~held] = torch.nan


MIXED = [(4, ("q_proj",)), (8, ATTN), (12, ALL), (16, ALL), (64, ALL), (1, ("down_proj",))]


@pytest.fixture
def poisoned(make_slab):
    """A slab with ranks 1..64 over pages of 8, holes between them, every other row NaN."""
    filler = make_adapter(16, ("q_proj",), seed=99)
    adapters = [make_adapter(r, m, seed=i) for i, (r, m) in enumerate(MIXED)]
    reg = Registry(filler, *adapters)
    budget = page_costs(TINY_SPEC, max_rank=64).bytes_for(16)
    slab = make_slab(reg, slab_bytes=budget, num_slots=None, max_rank=64, max_cpu_loras=0)
    cycle(slab, reg.versions[0])  # pages 0-1, until the rank 1, last, evicts it: 1 is a hole
    slots = {slab.acquire(v): reg.adapters[v] for v in reg.versions[1:]}
    assert sorted(slots) == [0, 2, 3, 4, 6, 8] and reg.versions[0] not in slab.residents()
    poison(slab)
    return slab, slots


@pytest.mark.parametrize(
    "way, knobs",
    [("in place", {}), ("padded", {"MAX_PADDING": 1e9}), ("grouped", {"MAX_PADDED_TOKENS": 0})],
)
def test_poisoned_mixed_ranks_through_the_torch_ways(poisoned, way, knobs, monkeypatch):
    slab, adapters = poisoned
    for name, value in knobs.items():
        monkeypatch.setattr(cpu_plan, name, value)
    each = 40 if way == "in place" else 2  # a prefill's runs, or a decode's few per adapter
    slots = [s for s in (*adapters, -1) for _ in range(each)]
    if way != "in place":
        random.Random(1).shuffle(slots)
    ids = torch.tensor(slots, dtype=torch.int32)
    for layer in range(TINY_SPEC.num_layers):
        for m in ALL:
            x = torch.randn(len(slots), TINY_SPEC.shapes[m][0])
            got = run_slab(slab, layer, m, x, ids)
            want = oracle(x, slots, adapters, layer, m)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("native", [False, True], ids=["fused padded", "compiled"])
def test_poisoned_mixed_ranks_as_a_model_step(poisoned, native, monkeypatch):
    if native and not lora_native.available():
        pytest.skip("no compiled kernel here")
    if not native:
        monkeypatch.setattr(lora_native, "available", lambda: False)
    monkeypatch.setattr(cpu_plan, "MAX_PADDING", 1e9)
    slab, adapters = poisoned
    slots = [*adapters, -1, *list(adapters)[::2]]
    ids = torch.tensor(slots, dtype=torch.int32)
    for m in ALL:
        x = torch.randn(len(slots), TINY_SPEC.shapes[m][0])
        got = run_slab(slab, 1, m, x, ids, host=True)
        torch.testing.assert_close(got.double(), oracle(x, slots, adapters, 1, m),
                                   rtol=1e-5, atol=1e-4)  # fmt: skip


def test_poisoned_mixed_ranks_through_triton(poisoned):
    """The Triton kernels on the slab's own stacks (interpreted without a GPU)."""
    from kernels.lora_expand_triton import lora_expand_triton
    from kernels.lora_shrink_triton import lora_shrink_triton

    if torch.cuda.is_available():
        pytest.skip("the slab here is on the CPU; tests/kernels runs Triton on the GPU")
    slab, adapters = poisoned
    slots = [*adapters, -1, *list(adapters)[1::2]]
    ids = torch.tensor(slots, dtype=torch.int32)
    segments = dataclasses.replace(build_segments(ids, slab.ranks), cpu_plan=None)
    for m in ("q_proj", "down_proj"):
        x = torch.randn(len(slots), TINY_SPEC.shapes[m][0])
        a, b = slab.lora_a(0, m), slab.lora_b(0, m)
        t = torch.zeros(1, len(slots), slab.max_rank)
        lora_shrink_triton(x, (a,), t, segments)
        y = torch.zeros(len(slots), b.shape[2])
        lora_expand_triton(t, (b,), y, segments, slab.scales)
        torch.testing.assert_close(y.double(), oracle(x, slots, adapters, 0, m),
                                   rtol=1e-4, atol=1e-3)  # fmt: skip
