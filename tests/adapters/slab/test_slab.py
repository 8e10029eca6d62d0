"""The adapter slab: slot contents, the kernels reading them, LRU and pins, the host tier,
failed loads and threads (the hypothesis state machine is in test_slab_properties.py)."""

import dataclasses
import math
import random
import time
from collections import Counter

import pytest
import torch

from adapters.errors import AdapterError
from adapters.format.lora_modules import LoraModule
from adapters.slab.stats import SlabFull
from kernels import build_segments, lora_expand, lora_shrink
from tests.adapters.factory import TINY_SPEC
from tests.adapters.slab.helpers import (
    ALL,
    ATTN,
    BAD,
    Registry,
    assert_holds,
    cycle,
    in_threads,
    make_adapter,
)


@pytest.mark.parametrize(
    "rank, modules, rslora, dtype",
    [
        (1, ("q_proj",), False, torch.float32),
        (4, ("q_proj", "v_proj"), False, torch.float32),
        (8, ATTN, False, torch.float32),  # a rank 8 in rows 0..7 over a rank 16: 8..15 are stale
        (8, ("o_proj", "gate_proj", "down_proj"), True, torch.float32),
        (16, ALL, False, torch.float32),
        (4, ATTN, True, torch.bfloat16),
    ],
)
def test_slot_holds_the_adapter(make_slab, rank, modules, rslora, dtype):
    adapter = make_adapter(rank, modules, seed=rank, rslora=rslora)
    assert adapter.scale == pytest.approx(16 / math.sqrt(rank) if rslora else 16 / rank)
    # One slot, first dirtied by a rank-16 adapter on every module: nothing stale may show.
    reg = Registry(make_adapter(16, ALL, seed=99), adapter)
    slab = make_slab(reg, num_slots=1, dtype=dtype)
    cycle(slab, reg.versions[0])
    assert slab.acquire(reg.versions[1]) == 0
    assert slab.lora_a(0, "q_proj").dtype == dtype
    assert_holds(slab, 0, adapter)


@pytest.mark.parametrize("case", ["rank", "module", "shape", "digest"])
def test_an_adapter_that_does_not_fit_is_rejected(make_slab, case):
    good = make_adapter(8, ("q_proj", "v_proj"))
    bad = {
        "rank": make_adapter(32, ("q_proj",)),
        "module": make_adapter(8, ("q_proj", "o_proj")),
        "shape": dataclasses.replace(
            good,
            modules={
                k: LoraModule(m.layer, m.module, m.a[:, :32], m.b) for k, m in good.modules.items()
            },
        ),
        "digest": good,
    }[case]
    reg = Registry(good)
    reg.adapters[BAD] = bad
    slab = make_slab(reg, num_slots=1, modules=("q_proj", "k_proj", "v_proj"))
    with pytest.raises(AdapterError, match=f"adapter {BAD}"):
        slab.acquire(BAD)
    assert slab.residents() == {} and int(slab.ranks[0]) == 0 and slab.stats().failed_loads == 1
    assert_holds(slab, slab.acquire(reg.versions[0]), good)


def test_kernels_compute_each_tokens_adapter_from_the_slab(make_slab):
    adapters = [
        make_adapter(4, ("q_proj",), 1),
        make_adapter(16, ALL, 2, rslora=True),
        make_adapter(8, ("v_proj", "down_proj"), 3),
    ]
    reg = Registry(make_adapter(2, ALL, seed=4), *adapters)
    slab = make_slab(reg, num_slots=4)
    cycle(slab, reg.versions[0])  # slot 0 stays resident, used by no token
    slots = [slab.acquire(v) for v in reg.versions[1:]]
    gen = torch.Generator().manual_seed(0)
    which = torch.randint(-1, len(adapters), (24,), generator=gen)  # adapter per token, -1: none
    which[:2] = -1
    slot_ids = torch.tensor([slots[i] if i >= 0 else -1 for i in which.tolist()])
    segments = build_segments(slot_ids, slab.ranks)
    for layer in range(TINY_SPEC.num_layers):
        for m in ALL:
            fan_in, fan_out = TINY_SPEC.shapes[m]
            x = torch.randn(len(which), fan_in, generator=gen)  # [tokens, in]
            t = torch.zeros(len(which), slab.max_rank)  # [tokens, max_rank]
            y = torch.zeros(len(which), fan_out)  # [tokens, out]
            lora_shrink(x, slab.lora_a(layer, m), t, segments)
            lora_expand(t, slab.lora_b(layer, m), y, segments, slab.scales)
            want = torch.zeros(len(which), fan_out, dtype=torch.float64)  # 0 without an adapter
            for i, ad in enumerate(adapters):  # y = scale * x @ a.T @ b.T, in float64
                if (mod := ad.modules.get((layer, m))) is not None:
                    rows = which == i
                    want[rows] = ad.scale * (x[rows].double() @ mod.a.double().T @ mod.b.double().T)
            torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-3)


def test_eviction_is_lru_among_unpinned(make_slab):
    reg = Registry(*(make_adapter(4, seed=i) for i in range(5)))
    v = reg.versions
    slab = make_slab(reg, num_slots=3, page_rank=16)  # one page per adapter: slots of old
    slots = [slab.acquire(x) for x in v[:3]]
    slab.release(v[2])
    slab.release(v[1])  # release counts as use: order v0 (pinned), v2, v1
    assert slab.acquire(v[3]) == slots[2]  # v0 is older but pinned
    assert slab.slot_of(v[2]) is None
    slab.release(v[3])  # order v0, v1, v3
    assert slab.acquire(v[4]) == slots[1]
    assert list(slab.residents()) == [v[0], v[3], v[4]] and slab.stats().evictions == 2


def test_pins_count_and_a_fully_pinned_slab_is_full(make_slab):
    reg = Registry(*(make_adapter(4, seed=i) for i in range(3)))
    v0, v1, v2 = reg.versions
    slab = make_slab(reg, num_slots=2, page_rank=16)
    with pytest.raises(ValueError, match="not pinned"):
        slab.release(v0)
    slot0, _, _ = slab.acquire(v0), slab.acquire(v0), slab.acquire(v1)
    with pytest.raises(SlabFull, match="all 2 adapter pages are held by pinned"):
        slab.acquire(v2)
    slab.release(v0)  # one of its two pins
    assert isinstance(slab.prefetch(v2).exception(timeout=5), SlabFull)
    assert reg.calls[v2] == 0 and set(slab.residents()) == {v0, v1}
    slab.release(v0)
    assert slab.acquire(v2) == slot0
    with pytest.raises(ValueError, match="not pinned"):
        slab.release(v0)


def test_host_tier_refills_without_the_registry_and_drops_its_lru(make_slab):
    reg = Registry(make_adapter(4, seed=1), make_adapter(8, ATTN, seed=2), make_adapter(4, seed=3))
    v0, v1, v2 = reg.versions
    slab = make_slab(reg, num_slots=1, max_cpu_loras=2, page_rank=16)  # one adapter at once
    for v in (v0, v1, v0, v1):
        assert_holds(slab, slab.acquire(v), reg.adapters[v])
        slab.release(v)
    cycle(slab, v1)
    assert reg.calls == Counter({v0: 1, v1: 1})
    s = slab.stats()
    assert (s.loads, s.registry_hits, s.host_hits, s.slot_hits) == (4, 2, 2, 1)
    assert (s.evictions, s.resident) == (3, 1) and s.load_seconds > 0
    cycle(slab, v2, v1, v0, v1)  # host tier after each: v1 v2 | v2 v1 | v1 v0 | v0 v1
    assert reg.calls == Counter({v0: 2, v1: 1, v2: 1})
    assert slab.stats().host_evictions == 2
    cycle(make_slab(reg, num_slots=1, max_cpu_loras=0, page_rank=16), v0, v1, v0)
    assert reg.calls[v0] == 4


def test_failed_load_reaches_every_waiter_and_frees_the_slot(make_slab):
    reg = Registry(make_adapter(), gated=True)
    error = reg.fail[BAD] = AdapterError("registry: no such version")
    slab = make_slab(reg, num_slots=1)

    def open_gate():
        assert reg.entered.wait(5)
        deadline = time.monotonic() + 10  # every acquire joins the held load, pinning its slot
        while slab._pins[BAD] < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        reg.gate.set()

    assert in_threads(lambda _: slab.acquire(BAD), 3, meanwhile=open_gate) == [error] * 3
    assert reg.calls[BAD] == 1
    assert slab.slot_of(BAD) is None and slab.residents() == {} and int(slab.ranks[0]) == 0
    cycle(slab, reg.versions[0])  # slot 0 is free: the waiters' pins went with the load
    assert slab.prefetch(BAD).exception(timeout=5) is error
    assert reg.calls[BAD] == 2  # a failure is not cached: the next request retries
    assert slab.stats().failed_loads == 2


def test_a_slab_made_under_inference_mode_loads_and_evicts(make_slab):
    reg = Registry(make_adapter(), make_adapter(4, seed=5))
    v0, v1 = reg.versions
    with torch.inference_mode():  # a caller's; the loads run on the slab's own threads
        slab = make_slab(reg, num_slots=1, page_rank=16)
    assert slab.prefetch(v0).result(timeout=5) == 0
    assert_holds(slab, 0, reg.adapters[v0])
    assert slab.prefetch(v1).result(timeout=5) == 0  # v0 evicted: its slot cleared
    assert_holds(slab, 0, reg.adapters[v1])


def test_a_load_whose_cleanup_fails_still_wakes_its_waiters(make_slab, monkeypatch):
    reg = Registry(make_adapter())
    slab = make_slab(reg, num_slots=1)
    error = RuntimeError("writing the slot failed")

    def fail(*args):
        raise error

    monkeypatch.setattr(slab.contents, "write", fail)
    monkeypatch.setattr(slab.contents, "clear", lambda slot: fail())
    assert slab.prefetch(reg.versions[0]).exception(timeout=5) is error


def test_acquire_waits_for_a_running_prefetch(make_slab):
    reg = Registry(make_adapter(), make_adapter(4, seed=5), gated=True)
    v0, v1 = reg.versions
    slab = make_slab(reg, num_slots=1, page_rank=16)
    future = slab.prefetch(v0)
    assert reg.entered.wait(5)
    assert not future.done() and slab.slot_of(v0) is None
    got = in_threads(lambda _: slab.acquire(v0), 1, meanwhile=reg.gate.set)
    assert got == [future.result(timeout=5)] and reg.calls[v0] == 1
    slab.release(v0)
    assert slab.prefetch(v0).result(timeout=5) == got[0]  # resident: a done future
    assert slab.prefetch(v1).result(timeout=5) == 0  # prefetch pins nothing: v0 was evictable
    slab.close()
    with pytest.raises(RuntimeError, match="closed"):
        slab.acquire(v0)


@pytest.mark.parametrize("num_versions, max_cpu_loras", [(4, 0), (6, 6)])
def test_threads_acquiring_overlapping_versions(make_slab, num_versions, max_cpu_loras):
    reg = Registry(*(make_adapter(4, ATTN, seed=i) for i in range(num_versions)), delay=0.002)
    # Room for as many rank-16 adapters as threads, each pinning one rank-4 version (one
    # page) at a time: never SlabFull.
    slab = make_slab(reg, num_slots=4, max_cpu_loras=max_cpu_loras)

    def worker(seed):
        rnd = random.Random(seed)
        for _ in range(30):
            v = rnd.choice(reg.versions)
            assert_holds(slab, slab.acquire(v), reg.adapters[v])  # a pinned slot stays put
            slab.release(v)

    assert in_threads(worker, 4) == [None] * 4
    # Each version comes from the registry once: then it stays in a slot or the host tier.
    assert reg.calls == Counter(dict.fromkeys(reg.versions, 1))
    pages = sorted(slab.residents().values())
    assert len(pages) <= slab.num_pages == 8 and len(set(pages)) == len(pages)
