"""Paged stacks laid out as the adapter slab lays them out, for the kernel tests.

Adapter i holds ceil(rank_i / page_rank) contiguous pages from its slot, firsts[i]. A stack
is rows [(num_pages - 1) * page_rank + max_rank, width] viewed [num_pages, max_rank, width]
with stride(0) = page_rank * width, so slots overlap. Every row no adapter holds (free
pages, an adapter's pages past its rank, the tail past the last page) is NaN: a kernel that
reads one brings NaN into its result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Ranks 1..max_rank with page_rank 8: one page, a whole page, a page and a half, two pages,
# all eight; free pages between them and at the end.
#   page   0   1    2   3-4   5-6   7   8-15   16   17   18 19
#   rank   4   -    8   12    16    -   64     8    1    -  -
FIRSTS = (0, 2, 3, 5, 8, 16, 17)
RANKS = (4, 8, 12, 16, 64, 8, 1)
NUM_PAGES, PAGE_RANK, MAX_RANK = 20, 8, 64


@dataclass(frozen=True)
class Paged:
    """Where each adapter is: its slot (first page) and rank."""

    firsts: tuple[int, ...] = FIRSTS
    ranks: tuple[int, ...] = RANKS
    num_pages: int = NUM_PAGES
    page_rank: int = PAGE_RANK
    max_rank: int = MAX_RANK

    @property
    def num_rows(self) -> int:
        return (self.num_pages - 1) * self.page_rank + self.max_rank

    def slot_ranks(self) -> torch.Tensor:
        """[num_pages] int32: each adapter's rank at its slot, 0 on every other page."""
        ranks = torch.zeros(self.num_pages, dtype=torch.int32)
        ranks[list(self.firsts)] = torch.tensor(self.ranks, dtype=torch.int32)
        return ranks

    def scales(self, gen: torch.Generator) -> torch.Tensor:
        """[num_pages] float32: a scale at each slot, 0 on every other page."""
        scales = torch.zeros(self.num_pages)
        scales[list(self.firsts)] = torch.rand(len(self.firsts), generator=gen) * 2 + 0.25
        return scales

    def stack(self, width: int, fan_in: int, gen, dtype, device="cpu") -> torch.Tensor:
        """A paged [num_pages, max_rank, width] view: each adapter's rows random, the rest NaN."""
        rows = torch.full((self.num_rows, width), torch.nan)
        for first, rank in zip(self.firsts, self.ranks):
            start = first * self.page_rank
            rows[start : start + rank] = torch.randn(rank, width, generator=gen) / fan_in**0.5
        rows = rows.to(dtype=dtype, device=device)
        size, strides = (self.num_pages, self.max_rank, width), (self.page_rank * width, width, 1)
        return rows.as_strided(size, strides)

    def tokens(self, kind: str, gen: torch.Generator) -> list[int]:
        """Each token's slot (-1: base only): `decode` one or two tokens per adapter, in a
        random order; `runs` 40 adjacent tokens per adapter (a prefill)."""
        if kind == "runs":
            return [s for s in (*self.firsts, -1) for _ in range(40)]
        assert kind == "decode", kind
        slots = [*self.firsts, *self.firsts[::2], -1, -1]
        return [slots[i] for i in torch.randperm(len(slots), generator=gen).tolist()]
