"""Where a load goes in the paged slab (adapters/slab/alloc.py): the lowest free run, else
the run whose most recent occupant is least recent, against brute force; which token slot."""

from __future__ import annotations

import random

import pytest

from adapters.slab.alloc import choose_run, choose_token_slot


def brute_run(owners, n, recency):
    """choose_run's contract, by brute force over every run."""
    best = None
    for first in range(len(owners) - n + 1):
        held = {v for v in owners[first : first + n] if v is not None}
        if not held <= recency.keys():
            continue
        cost = max((recency[v] for v in held), default=-1)
        if best is None or cost < best[0]:
            best = (cost, first)
    return None if best is None else best[1]


OWNERS = [None, "a", "a", None, "b", "p", None, None]  # p pinned: not in the recency


@pytest.mark.parametrize(
    "n, recency, want",
    [
        (1, {"a": 0, "b": 1}, 0),  # the lowest free page
        (2, {"a": 0, "b": 1}, 6),  # the lowest free run, past evictable ones
        (3, {"a": 0, "b": 1}, 0),  # no free run: a's run (a is the least recent)
        (3, {"a": 1, "b": 0}, 0),  # every run clear of p holds a: lowest first on the tie
        (4, {"a": 0, "b": 1}, 0),  # 0-3 {a}, cheaper than 1-4 {a, b}
        (5, {"a": 0, "b": 1}, 0),  # 0-4 {a, b}: clear of p, just
        (6, {"a": 0, "b": 1}, None),  # every run of 6 touches p
        (3, {"b": 0}, None),  # a pinned too: 3-5 and 5-7 touch p, 0-2 ... 2-4 touch a
    ],
)
def test_choose_run_table(n, recency, want):
    assert choose_run(OWNERS, n, recency) == want == brute_run(OWNERS, n, recency)


def test_choose_run_agrees_with_brute_force_on_random_tables():
    rnd = random.Random(0)
    for _ in range(2000):
        pages, names = rnd.randint(1, 24), "abcdefgh"
        owners = [rnd.choice([None, None, *names]) for _ in range(pages)]
        order = rnd.sample(names, len(names))
        recency = {v: i for i, v in enumerate(order) if rnd.random() < 0.8}
        n = rnd.randint(1, 9)
        assert choose_run(owners, n, recency) == brute_run(owners, n, recency), (owners, n)


def test_choose_token_slot_table():
    lru = {"a": 1, "b": 0}
    assert choose_token_slot(["a", None, "b"], lru, set()) == 1  # a free one
    assert choose_token_slot(["a", "b"], lru, {"a"}) == 0  # one going anyway
    assert choose_token_slot(["a", "b"], lru, set()) == 1  # the least recently used holder
    assert choose_token_slot(["a", "p"], {"p": 0}, set()) == 1  # a pinned: p's
    assert choose_token_slot(["x", "y"], lru, set()) is None  # both pinned or loading
