"""How the torch (CPU) path of the LoRA ops splits one step's segments into work.

Per distinct rank, one `RankGroup`, run in one of three ways:
  - in place (prefill: each sequence's tokens are adjacent and share its
    adapter): run by run, `x[run] @ A.T` and `y[run].addmm_`, with no gather
    and no scatter. Runs are cut into chunks of at most PART_TOKENS and dealt
    out to the CPU threads, since MKL runs such thin matmuls on one core;
  - padded (decode, adapters about equally busy): the group's slots are one
    range of the slab and each gets a bucket of `bucket` tokens, so the
    shrink and the expand are each one batched matmul per slice over that
    slab range (`bmm`), with one gather and one scatter for all slices;
  - grouped (anything else): `grouped_mm` over `Part`s of at most
    PART_TOKENS sorted tokens; parts keep temporaries small, so they come
    from the allocator's heap instead of being page-faulted in on each call.
The grouped groups' expand is one `embedding_bag` over the whole step: token
t's bag is rows slot*slot_rows + [0, rank) of B viewed as a table of its rows (slot_rows:
max_rank for a contiguous stack, page_rank for the slab's paged one), weighted by t's
shrink output (see `Bags`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

PART_TOKENS = 256
MIN_RUN_FOR_IN_PLACE = 32  # mean tokens per segment; shorter runs pay more in Python than they save
MIN_TOKENS_TO_SPLIT_RUNS = 128  # in-place work smaller than this stays on one thread
MAX_PADDING = 2.0  # padded only while buckets * slots in range <= this * tokens
MAX_PADDED_TOKENS = 1024  # decode-sized; a larger batch takes parts, with bounded temporaries


@dataclass(frozen=True)
class Part:
    """Sorted tokens [start, end), which use slots [first_slot, end_slot) only.

    offs[i] = end of slot (first_slot + i)'s tokens, relative to start: the
    layout grouped_mm takes over slab[first_slot:end_slot].
    """

    start: int
    end: int
    first_slot: int
    end_slot: int
    offs: torch.Tensor  # [end_slot - first_slot] int32


@dataclass(frozen=True)
class Padded:
    """Sorted token i of the group sits at row positions[i] of [end_slot - first_slot, bucket].

    When `dense` (no row is padding: every slot in the range has `bucket` tokens), the
    rows are the group's sorted tokens in order, so x is gathered in one op.
    """

    first_slot: int
    end_slot: int
    bucket: int
    positions: torch.Tensor  # [group tokens] int64
    dense: bool
    rows: torch.Tensor  # [group tokens] int64: the tokens, in sorted order
    slots: tuple[int, ...]  # the group's distinct slots
    row_slots: torch.Tensor  # [(end_slot - first_slot) * bucket] int64: the slot of each row
    bucket_rows: torch.Tensor | None  # rows viewed [slots in range, bucket], when dense


@dataclass(frozen=True)
class Run:
    """Tokens [first_token, first_token + num_tokens), all in `slot`."""

    slot: int
    first_token: int
    num_tokens: int


@dataclass(frozen=True)
class RankGroup:
    """The adjacent segments whose slots share one rank; exactly one way to run it is set."""

    rank: int
    start: int  # sorted tokens [start, end)
    end: int
    runs: tuple[tuple[Run, ...], ...]  # in place: one tuple per thread
    padded: Padded | None
    parts: tuple[Part, ...]  # grouped

    @property
    def in_place(self) -> bool:
        return bool(self.runs)


@dataclass(frozen=True)
class Bags:
    """The expand of every token of the grouped groups, as one embedding_bag.

    Element e of the flat bag list is row elem_row[e] of slot elem_slot[e],
    weighted by t[elem_token[e], elem_row[e]]; bag i starts at offsets[i].
    """

    tokens: torch.Tensor  # [num_bags] int64, in sorted (rank, slot) order
    offsets: torch.Tensor  # [num_bags] int64
    elem_token: torch.Tensor  # [num_elems] int64
    elem_slot: torch.Tensor  # [num_elems] int64
    elem_row: torch.Tensor  # [num_elems] int64, in [0, rank)
    # (slot_rows, max_rank) -> (table rows, positions in t flattened): the same for every
    # layer of the step
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    def index(self, slot_rows: int, max_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows of B viewed as a table of rows, slot s's first at s * slot_rows; positions
        in t[s], [num_tokens, max_rank], viewed flat)."""
        key = (slot_rows, max_rank)
        if key not in self._index:
            self._index[key] = (
                self.elem_slot * slot_rows + self.elem_row,
                self.elem_token * max_rank + self.elem_row,
            )
        return self._index[key]


@dataclass(frozen=True)
class CpuPlan:
    groups: tuple[RankGroup, ...]
    bags: Bags | None  # None when no group runs grouped
    # [num_active] int32: the rank of each sorted token, when no group runs in place (the
    # compiled kernel's input, kernels/lora_native.py, which then runs the step); else None
    token_ranks: torch.Tensor | None = None
    # (token_order, token_slots, token_ranks, [min, max] of each): the kernel's indices and
    # their bounds, reduced here from the host lists they were made from, so that the kernel
    # checks them (kernels/lora_native.py) without reading anything back in a forward
    kernel_indices: tuple | None = field(default=None, compare=False, repr=False)

    @property
    def has_runs(self) -> bool:
        """Whether any group runs in place."""
        return any(g.in_place for g in self.groups)

    @property
    def all_padded(self) -> bool:
        """Whether every group runs padded (a decode step), so shrink and expand can fuse."""
        return all(g.padded is not None for g in self.groups)


def plan_cpu(
    token_order, token_slots, seg_starts, seg_slots, seg_ranks, num_threads: int, host=None
) -> CpuPlan:
    """The plan for one step, from build_segments' tensors (all on the CPU).

    host: (token_order, seg_starts, seg_slots, seg_ranks) as lists, when the caller has them.
    """
    if host is not None:
        order, starts, slots, ranks = host
    else:
        order, starts = token_order.tolist(), seg_starts.tolist()
        slots, ranks = seg_slots.tolist(), seg_ranks.tolist()
    counts = [b - a for a, b in itertools.pairwise(starts)]
    firsts = [order[a] for a in starts[:-1]]
    lasts = [order[b - 1] for b in starts[1:]]
    groups = []
    lo = 0
    for rank, run in itertools.groupby(ranks):
        size = len(list(run))
        hi = lo + size
        g_slots, g_counts, g_bounds = slots[lo:hi], counts[lo:hi], starts[lo : hi + 1]
        start, end = g_bounds[0], g_bounds[-1]
        # Tokens of a segment increase (a stable sort): it is one run iff last - first + 1 == count.
        runs_ok = all(lasts[i] - firsts[i] + 1 == counts[i] for i in range(lo, hi))
        runs, padded, parts = (), None, ()
        if runs_ok and end - start >= MIN_RUN_FOR_IN_PLACE * size:
            runs = _deal_runs(g_slots, firsts[lo:hi], g_bounds, num_threads)
        else:
            padded = _padded(g_slots, g_counts, token_order[start:end])
            if padded is None:
                parts = _parts(start, end, g_slots, g_counts)
        groups.append(RankGroup(rank, start, end, runs, padded, parts))
        lo = hi
    token_ranks = kernel_indices = None
    if not any(g.in_place for g in groups):
        token_ranks = torch.tensor(ranks, dtype=torch.int32).repeat_interleave(
            torch.tensor(counts, dtype=torch.int64)
        )
        # Each token's slot and rank is its segment's; an empty step has no bounds to check.
        lists = (order, slots, ranks)
        bounds = tuple(v for xs in lists for v in (min(xs, default=0), max(xs, default=0)))
        kernel_indices = (token_order, token_slots, token_ranks, bounds)
    bags = _bags(token_order, token_slots, groups)
    return CpuPlan(tuple(groups), bags, token_ranks, kernel_indices)


def _padded(slots: list[int], counts: list[int], rows: torch.Tensor) -> Padded | None:
    first, end = slots[0], slots[-1] + 1
    bucket = max(counts)
    if sum(counts) > MAX_PADDED_TOKENS or bucket * (end - first) > MAX_PADDING * sum(counts):
        return None
    positions = [(s - first) * bucket + k for s, c in zip(slots, counts) for k in range(c)]
    dense = len(positions) == bucket * (end - first)
    row_slots = torch.arange(first, end).repeat_interleave(bucket)
    grid = rows.view(end - first, bucket) if dense else None
    return Padded(
        first, end, bucket, torch.tensor(positions), dense, rows, tuple(slots), row_slots, grid
    )


def _parts(start: int, end: int, slots: list[int], counts: list[int]) -> tuple[Part, ...]:
    n = end - start
    num_parts = -(-n // PART_TOKENS)
    bounds = [start + n * i // num_parts for i in range(num_parts + 1)]
    seg_ends = list(itertools.accumulate(counts))  # relative to start
    parts = []
    for p0, p1 in itertools.pairwise(bounds):
        lo, hi = p0 - start, p1 - start
        used = [i for i, e in enumerate(seg_ends) if e > lo and e - counts[i] < hi]
        first, last = slots[used[0]], slots[used[-1]] + 1
        per_slot = torch.zeros(last - first, dtype=torch.int64)
        for i in used:  # a segment cut by a part boundary is read by both parts
            per_slot[slots[i] - first] = min(seg_ends[i], hi) - max(seg_ends[i] - counts[i], lo)
        offs = per_slot.cumsum(0).to(torch.int32)
        parts.append(Part(p0, p1, first, last, offs))
    return tuple(parts)


def _deal_runs(slots, firsts, bounds, num_threads) -> tuple[tuple[Run, ...], ...]:
    """Chunks of at most PART_TOKENS, dealt into contiguous, balanced lists, one per thread."""
    chunks = []
    for slot, first, lo, hi in zip(slots, firsts, bounds, bounds[1:]):
        for c in range(0, hi - lo, PART_TOKENS):
            chunks.append(Run(slot, first + c, min(PART_TOKENS, hi - lo - c)))
    total = bounds[-1] - bounds[0]
    workers = min(num_threads, len(chunks)) if total >= MIN_TOKENS_TO_SPLIT_RUNS else 1
    lists: list[list[Run]] = [[] for _ in range(workers)]
    done = 0
    for run in chunks:  # by the tokens dealt so far: contiguous lists of about equal work
        lists[min(workers - 1, done * workers // total)].append(run)
        done += run.num_tokens
    return tuple(tuple(runs) for runs in lists if runs)


def _bags(token_order, token_slots, groups) -> Bags | None:
    picked = [(g.start, g.end, g.rank) for g in groups if g.parts]
    if not picked:
        return None
    num_elems = sum((b - a) * r for a, b, r in picked)
    sorted_slots = token_slots.long()
    tokens = torch.cat([token_order[a:b] for a, b, _ in picked])
    slots = torch.cat([sorted_slots[a:b] for a, b, _ in picked])
    ranks = torch.cat([torch.full((b - a,), r, dtype=torch.int64) for a, b, r in picked])
    ends = torch.cumsum(ranks, 0)
    offsets = ends - ranks
    elem_bag = torch.repeat_interleave(torch.arange(tokens.numel()), ranks)
    return Bags(
        tokens=tokens,
        offsets=offsets,
        elem_token=tokens[elem_bag],
        elem_slot=slots[elem_bag],
        elem_row=torch.arange(num_elems) - offsets[elem_bag],
    )
