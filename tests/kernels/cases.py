"""The parameter grid for the LoRA op tests, sampled to a fixed subset, and the inputs it makes."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

POPULARITY = ("distinct", "uniform", "zipf", "identical", "skewed", "none", "runs")
TOLERANCE = {  # (atol, rtol) against the float64 oracle, on O(1) values
    torch.float32: (2e-4, 2e-4),
    torch.float16: (4e-2, 2e-2),
    torch.bfloat16: (2.5e-1, 5e-2),
}


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    num_tokens: int
    hidden: int
    ranks: tuple[int, ...]  # per slot; max_rank is the slab's
    max_rank: int
    popularity: str
    widths: tuple[int, ...]  # output width of each expand slice (one entry: no fusion)
    seed: int

    def __str__(self):
        dt = str(self.dtype).removeprefix("torch.")
        return (
            f"{dt}-T{self.num_tokens}-H{self.hidden}-r{self.max_rank}"
            f"{'mixed' if len(set(self.ranks)) > 1 else ''}-{self.popularity}-w{'x'.join(map(str, self.widths))}"
        )


def slot_ids_for(
    popularity: str, num_tokens: int, num_slots: int, gen: torch.Generator
) -> torch.Tensor:
    if popularity == "distinct":
        ids = torch.arange(num_tokens) % num_slots
    elif popularity == "uniform":
        ids = torch.randint(0, num_slots, (num_tokens,), generator=gen)
        ids[torch.rand(num_tokens, generator=gen) < 0.2] = -1  # some rows use the base alone
    elif popularity == "zipf":
        p = 1.0 / torch.arange(1, num_slots + 1, dtype=torch.float64) ** 1.2
        ids = torch.multinomial(p, num_tokens, replacement=True, generator=gen)
    elif popularity == "identical":
        ids = torch.full((num_tokens,), num_slots - 1)
    elif popularity == "skewed":
        ids = torch.randint(0, num_slots, (num_tokens,), generator=gen)
        ids[torch.rand(num_tokens, generator=gen) < 0.9] = 0
    elif popularity == "none":
        ids = torch.full((num_tokens,), -1)
    elif popularity == "runs":  # prefill: each sequence's tokens adjacent, one adapter each
        num_runs = min(num_slots, 4, num_tokens)
        lengths = torch.full((num_runs,), num_tokens // num_runs)
        lengths[-1] += num_tokens - int(lengths.sum())
        run_slots = torch.randperm(num_slots, generator=gen)[:num_runs]
        run_slots[-1] = -1 if num_runs > 2 else run_slots[-1]  # a base-only sequence too
        return run_slots.repeat_interleave(lengths).to(torch.int32)
    else:
        raise AssertionError(popularity)
    return ids[torch.randperm(num_tokens, generator=gen)].to(torch.int32)


def sample_cases(n, *, dtypes, tokens, hiddens, rank_sets, widths, seed) -> list[Case]:
    """A fixed random subset of the full grid, covering every value of every axis at least once."""
    rng = random.Random(seed)
    axes = [dtypes, tokens, hiddens, rank_sets, POPULARITY, widths]
    grid = list(itertools.product(*axes))
    rng.shuffle(grid)
    picked = []
    for axis, values in enumerate(axes):  # every value of every axis appears
        for v in values:
            picked.append(next(g for g in grid if g[axis] == v and g not in picked))
    for g in grid:
        if len(picked) >= n:
            break
        if g not in picked:
            picked.append(g)
    cases = []
    for i, (dtype, t, h, (ranks, max_rank), pop, w) in enumerate(picked):
        cases.append(
            Case(
                dtype,
                t,
                h,
                tuple(ranks),
                max_rank,
                pop,
                tuple(w(h)) if callable(w) else tuple(w),
                seed + i,
            )
        )
    return cases


def make_inputs(case: Case, num_a_slices: int = 1):
    """Slab stacks with NaN past each slot's rank (reading them would poison the result)."""
    gen = torch.Generator().manual_seed(case.seed)
    num_slots = len(case.ranks)
    ranks = torch.tensor(case.ranks, dtype=torch.int32)

    def stack(rows, cols, fan_in):
        s = torch.randn(num_slots, rows, cols, generator=gen) / fan_in**0.5
        for slot, r in enumerate(case.ranks):
            s[slot, r:] = torch.nan  # padding past the rank: never to be read
        return s.to(case.dtype)

    x = torch.randn(case.num_tokens, case.hidden, generator=gen).to(case.dtype)
    lora_a = [stack(case.max_rank, case.hidden, case.hidden) for _ in range(num_a_slices)]
    lora_b = [stack(case.max_rank, w, max(case.ranks)) for w in case.widths]
    scales = (torch.rand(num_slots, generator=gen) * 2 + 0.25).to(torch.float32)
    slot_ids = slot_ids_for(case.popularity, case.num_tokens, num_slots, gen)
    return x, lora_a, lora_b, scales, slot_ids, ranks
