"""A hypothesis state machine over the slab: random acquire / prefetch / release sequences
never evict a pinned version, never exceed the slots, and every resident slot holds exactly
its version's tensors."""

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from adapters.errors import AdapterError
from adapters.slab import AdapterSlab, SlabFull
from tests.adapters.factory import TINY_SPEC
from tests.adapters.slab_helpers import ALL, ATTN, BAD, Registry, assert_holds, make_adapter

POOL = [(4, ("q_proj",)), (8, ATTN), (16, ALL), (2, ("up_proj",)), (8, ("k_proj",)), (1, ALL)]
NUM_SLOTS = 3


class SlabMachine(RuleBasedStateMachine):
    """Drives one slab and a model of it: resident versions in LRU order and pin counts."""

    def __init__(self):
        super().__init__()
        self.registry = Registry(*(make_adapter(r, m, seed=i) for i, (r, m) in enumerate(POOL)))
        self.registry.fail[BAD] = AdapterError("registry: gone")
        self.versions = [*self.registry.versions, BAD]
        self.slab = AdapterSlab(
            TINY_SPEC, num_slots=NUM_SLOTS, max_rank=16, max_cpu_loras=2, loader=self.registry
        )
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
            self.lru.remove(victim)
        if v == BAD:
            return AdapterError  # it failed after claiming (maybe evicting) a slot
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
        v = self.versions[i]
        if self.pins[v] == 0:
            with pytest.raises(ValueError):
                self.slab.release(v)
        else:
            self.slab.release(v)
            self.pins[v] -= 1
            self.lru.append(self.lru.pop(self.lru.index(v)))  # release counts as use

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
