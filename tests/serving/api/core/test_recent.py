"""The recent window keeps aggregates, not requests: its buckets stay under its capacity
however many tenants and adapters send, every request still counts, and two replicas'
windows merged are the window of both replicas' requests."""

import pickle

import numpy as np
import pytest

from serving.api.admin.stats import adapter_figures
from serving.api.core import ttft_sketch
from serving.api.core.recent import KEYS_PER_SECOND, OTHER, Recent, merge, rates, within


def test_many_tenants_and_adapters_stay_under_the_capacity():
    clock = [0.0]
    recent = Recent(window_s=30, clock=lambda: clock[0])
    rng = np.random.default_rng(1)
    n = 100_000
    # 2,000 tenants x 50 adapters each, over 60 s: far more pairs a second than buckets
    tenants, adapters = rng.integers(0, 2000, n), rng.integers(0, 50, n)
    ends, ttfts = np.sort(rng.uniform(0, 60, n)), rng.exponential(0.1, n)
    for i in range(n):
        clock[0] = float(ends[i])
        tenant = f"t{tenants[i]}"
        recent.add(tenant, f"{tenant}/a{adapters[i]}", float(ttfts[i]), 3)
        if i % 5000 == 0:
            assert len(recent) <= recent.capacity
    buckets = recent.buckets()
    assert len(buckets) == len(recent) <= recent.capacity
    assert recent.capacity == 31 * KEYS_PER_SECOND
    per_second = {}
    for b in buckets:
        per_second[b.second] = per_second.get(b.second, 0) + 1
        assert len(b.ttft) <= ttft_sketch.NUM_BINS
    assert max(per_second.values()) == KEYS_PER_SECOND
    assert any((b.tenant, b.adapter) == OTHER for b in buckets)
    # folding keeps every request: the window counts all those that ended in it
    now = clock[0]
    counted = rates(within(buckets, now, 30), 30)
    first = np.floor(now - 30 + 0.5)  # the oldest second whose middle is in the window
    assert counted["requests_per_s"] * 30 == np.count_nonzero(ends >= first)
    # what a replica ships is plain data, and small: some hundreds of KB, not the requests
    assert len(pickle.dumps(buckets)) < 200 * recent.capacity


def test_a_clock_that_steps_back_keeps_the_bound():
    clock = [100.0]
    recent = Recent(window_s=2, clock=lambda: clock[0])
    for second in (100.0, 101.5, 102.2, 50.0, 51.0, 52.0, 53.0):
        clock[0] = second
        recent.add("acme", "base", 0.01, 1)
    assert len(recent) <= recent.capacity == 3 * KEYS_PER_SECOND
    assert [b.second for b in recent.buckets()] == [51, 52, 53]


def test_two_replicas_merged_are_one_window_over_both():
    clock = [0.0]
    one, two, both = (Recent(window_s=10, clock=lambda: clock[0]) for _ in range(3))
    rng = np.random.default_rng(2)
    for i in range(3000):
        clock[0] = i * 0.005  # 15 s: the first 5 leave the window
        tenant = ("acme", "globex", "initech")[int(rng.integers(3))]
        label = f"{tenant}/a{int(rng.integers(4))}" if rng.random() < 0.8 else "base"
        ttft = float(rng.lognormal(-3, 1)) if rng.random() < 0.9 else None  # a queued item
        tokens = int(rng.integers(1, 64))
        (one if rng.random() < 0.4 else two).add(tenant, label, ttft, tokens)
        both.add(tenant, label, ttft, tokens)
    shipped = [pickle.loads(pickle.dumps(r.buckets())) for r in (one, two)]
    assert merge(shipped) == both.buckets()
    now = clock[0]
    assert rates(within(merge(shipped), now, 10), 10) == rates(within(both.buckets(), now, 10), 10)
    # the per-adapter rates of two replicas add up to those of one over both
    split = {"r0": within(shipped[0], now, 10), "r1": within(shipped[1], now, 10)}
    whole = {"r": within(both.buckets(), now, 10)}

    def figures(recent_of):
        rows = adapter_figures([], recent_of, 10, [], [], lambda label: True, "acme".__eq__)
        return {r["adapter"]: (r["requests_per_s"], r["tokens_per_s"]) for r in rows}

    assert figures(split).keys() == figures(whole).keys()
    for label, (requests, tokens) in figures(whole).items():
        assert figures(split)[label] == pytest.approx((requests, tokens))
