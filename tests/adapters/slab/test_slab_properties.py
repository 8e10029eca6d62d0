"""Hypothesis state machines over the slab: random acquire / prefetch / release sequences
never evict a pinned version, never exceed the slots, and every resident slot holds exactly
its version's tensors. One machine keeps a page per adapter (page_rank = max_rank: the
slots of a slab without pages); the other pages ranks 1..24 by 8 and checks every placement
and every SlabFull against a brute-force model of runs and their recency."""

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from adapters.errors import AdapterError
from adapters.slab.pages import page_costs
from adapters.slab.slab import AdapterSlab
from adapters.slab.stats import SlabFull
from tests.adapters.factory import TINY_SPEC
from tests.adapters.slab.helpers import ALL, ATTN, BAD, Registry, assert_holds, make_adapter

POOL = [(4, ("q_proj",)), (8, ATTN), (16, ALL), (2, ("up_proj",)), (8, ("k_proj",)), (1, ALL)]
NUM_SLOTS = 3


def release_as_modelled(machine, v: str) -> None:
    """Release v in machine's slab: a ValueError where the model holds no pin of it; else
    one pin fewer, and v the most recently used (a release counts as use)."""
    if machine.pins[v] == 0:
        with pytest.raises(ValueError):
            machine.slab.release(v)
    else:
        machine.slab.release(v)
        machine.pins[v] -= 1
        machine.lru.append(machine.lru.pop(machine.lru.index(v)))


class SlabMachine(RuleBasedStateMachine):
    """Drives one slab and a model of it: resident versions in LRU order and pin counts."""

    def __init__(self):
        super().__init__()
        self.registry = Registry(*(make_adapter(r, m, seed=i) for i, (r, m) in enumerate(POOL)))
        self.registry.fail[BAD] = AdapterError("registry: gone")
        self.versions = [*self.registry.versions, BAD]
        self.slab = AdapterSlab(
            TINY_SPEC, num_slots=NUM_SLOTS, max_rank=16, max_cpu_loras=2, loader=self.registry,
            page_rank=16,
        )  # fmt: skip
        self.lru: list[str] = []  # the model's residents, least recently used first
        self.pins: Counter[str] = Counter()

    def teardown(self):
        self.slab.close()

    def expect(self, v: str) -> type[Exception] | None:
        """Model a request to load v: None if it lands in a slot, else the error expected."""
        if v in self.lru:
            self.lru.remove(v)
        elif len(self.lru) == NUM_SLOTS:
            victim = next((u for u in self.lru if self.pins[u] == 0), None)
            if victim is None:
                return SlabFull
            if v == BAD:
                return AdapterError  # its fetch fails before it takes (or evicts) anything
            self.lru.remove(victim)
        if v == BAD:
            return AdapterError
        self.lru.append(v)
        return None

    @rule(i=st.integers(0, len(POOL)), pin=st.booleans())
    def request(self, i, pin):
        """acquire (pin) or prefetch (no pin) version i: it lands in a slot or fails as modelled."""
        v = self.versions[i]
        error = self.expect(v)
        try:
            slot = self.slab.acquire(v) if pin else self.slab.prefetch(v).result(timeout=5)
        except (SlabFull, AdapterError) as exc:
            assert error is not None and isinstance(exc, error), exc
            return
        assert error is None and slot == self.slab.slot_of(v)
        self.pins[v] += pin

    @rule(i=st.integers(0, len(POOL) - 1))
    def release(self, i):
        release_as_modelled(self, self.versions[i])

    @invariant()
    def slots_hold_exactly_their_versions(self):
        residents = self.slab.residents()
        assert list(residents) == self.lru
        assert len(set(residents.values())) == len(residents) <= NUM_SLOTS
        assert all(v in residents for v, n in self.pins.items() if n)  # pinned: never evicted
        for v, slot in residents.items():
            assert_holds(self.slab, slot, self.registry.adapters[v])
        empty = set(range(NUM_SLOTS)) - set(residents.values())
        assert all(int(self.slab.ranks[slot]) == 0 for slot in empty)


SlabMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
TestSlabMachine = SlabMachine.TestCase

# Ranks over pages of 8: one page, a part of one, two, three, and a whole 24 (3 pages).
PAGED_POOL = [(4, ("q_proj",)), (8, ATTN), (16, ALL), (2, ("up_proj",)), (12, ("k_proj",)),
              (24, ATTN), (17, ("v_proj",)), (1, ALL)]  # fmt: skip
NUM_PAGES = 7  # room for 2 adapters of rank 24 and a page: runs straddle adapters


def model_run(owners: list, n: int, lru: list[str], pins: Counter) -> int | None:
    """Brute force: the lowest free run of n pages, else the run of unpinned occupants whose
    most recently used one is least recent (lowest first); None if every run has a pin."""
    best = None
    for first in range(len(owners) - n + 1):
        held = {v for v in owners[first : first + n] if v is not None}
        if any(pins[v] for v in held):
            continue
        cost = max((lru.index(v) for v in held), default=-1)
        if best is None or cost < best[0]:
            best = (cost, first)
    return None if best is None else best[1]


class PagedSlabMachine(RuleBasedStateMachine):
    """Drives a paged slab and a model of its pages: owners per page, LRU order, pins."""

    def __init__(self):
        super().__init__()
        adapters = [make_adapter(r, m, seed=i) for i, (r, m) in enumerate(PAGED_POOL)]
        self.registry = Registry(*adapters)
        self.registry.fail[BAD] = AdapterError("registry: gone")
        self.versions = [*self.registry.versions, BAD]
        budget = page_costs(TINY_SPEC, max_rank=24).bytes_for(NUM_PAGES)
        self.slab = AdapterSlab(
            TINY_SPEC, slab_bytes=budget, max_rank=24, max_cpu_loras=0, loader=self.registry
        )
        assert self.slab.num_pages == NUM_PAGES
        self.owners: list[str | None] = [None] * self.slab.num_pages
        self.lru: list[str] = []
        self.pins: Counter[str] = Counter()

    def teardown(self):
        self.slab.close()

    def expect(self, v: str) -> tuple[type[Exception] | None, int | None]:
        """Model a request to load v: (None, its slot) if it lands, else (the error, None)."""
        if v in self.lru:
            self.lru.append(self.lru.pop(self.lru.index(v)))
            return None, self.owners.index(v)
        if model_run(self.owners, 1, self.lru, self.pins) is None:
            return SlabFull, None  # refused before the registry is asked
        if v == BAD:
            return AdapterError, None  # its fetch fails before it takes any page
        n = -(-self.registry.adapters[v].rank // 8)
        first = model_run(self.owners, n, self.lru, self.pins)
        if first is None:
            return SlabFull, None
        for going in {u for u in self.owners[first : first + n] if u is not None}:
            self.lru.remove(going)
            self.owners = [None if u == going else u for u in self.owners]
        self.owners[first : first + n] = [v] * n
        self.lru.append(v)
        return None, first

    @rule(i=st.integers(0, len(PAGED_POOL)), pin=st.booleans())
    def request(self, i, pin):
        v = self.versions[i]
        error, first = self.expect(v)
        try:
            slot = self.slab.acquire(v) if pin else self.slab.prefetch(v).result(timeout=5)
        except (SlabFull, AdapterError) as exc:
            assert error is not None and isinstance(exc, error), exc
            return
        assert error is None and slot == first
        self.pins[v] += pin

    @rule(i=st.integers(0, len(PAGED_POOL) - 1))
    def release(self, i):
        release_as_modelled(self, self.versions[i])

    @invariant()
    def pages_hold_exactly_their_versions(self):
        residents = self.slab.residents()
        assert list(residents) == self.lru
        assert residents == {v: self.owners.index(v) for v in self.lru}
        for v, slot in residents.items():
            assert_holds(self.slab, slot, self.registry.adapters[v])
        slots = set(residents.values())  # every other page: rank 0, scale 0
        assert all(int(self.slab.ranks[p]) == 0 == float(self.slab.scales[p])
                   for p in range(self.slab.num_pages) if p not in slots)  # fmt: skip
        assert self.slab.stats().pages_used == sum(u is not None for u in self.owners)


PagedSlabMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=25, deadline=None
)
TestPagedSlabMachine = PagedSlabMachine.TestCase
