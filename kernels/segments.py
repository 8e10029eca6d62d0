"""Per-step segment metadata for the segmented-gather LoRA ops.

A mixed batch gives every token an adapter slot (-1: base model only). The
LoRA ops visit tokens adapter by adapter, so each adapter's weights are read
once per step rather than once per token. This module sorts the tokens into
those runs once per step; every LoRA layer of the step reuses the result.

Example (all slots rank 16):
    slot per token   [-1, 0, 2, 1, 0]
    token_order      [1, 4, 3, 2]        tokens sorted by slot, slot -1 dropped
    seg_starts       [0, 2, 3, 4]        segment i is token_order[seg_starts[i]:seg_starts[i+1]]
    seg_slots        [0, 1, 2]

Tokens are sorted by (rank, slot), so the segments of one rank are adjacent:
the CPU path plans each rank's work once here (kernels/cpu_plan.py) and reads
only each adapter's first `rank` rows; the GPU kernels read the rank of each
segment to bound their loops. Either way a rank-8 adapter in a rank-64 slab
costs what rank 8 costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.cpu_plan import CpuPlan, plan_cpu
from kernels.device_tables import upload


@dataclass(frozen=True)
class Segments:
    """Which tokens use which adapter slot in one step; built by `build_segments`."""

    num_tokens: int
    num_slots: int
    # [num_active] int64 (index_copy_'s index dtype): active tokens sorted by (rank, slot)
    token_order: torch.Tensor
    token_slots: torch.Tensor  # [num_active] int32: slot of each sorted token
    seg_starts: torch.Tensor  # [num_segments + 1] int32: offsets into token_order
    seg_slots: torch.Tensor  # [num_segments] int32
    seg_ranks: torch.Tensor  # [num_segments] int32
    max_segment_len: int
    max_rank: int  # the largest rank any token uses (0 when none)
    cpu_plan: CpuPlan | None  # how the torch path splits the work; None off the CPU

    @property
    def num_segments(self) -> int:
        return self.seg_slots.numel()

    @property
    def num_active(self) -> int:
        return self.token_order.numel()


def build_segments(
    slot_ids: torch.Tensor,
    slot_ranks: torch.Tensor,
    host: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Segments:
    """Group tokens by adapter slot: segment i = tokens whose slot is seg_slots[i].

    slot_ids: [num_tokens] integer, -1 (base only) or a slot in [0, num_slots).
    slot_ranks: [num_slots] integer, the rank of the adapter in each slot
        (0 for an empty slot, which no token may use).
    host: (slot_ids, slot_ranks) as Python lists, when the caller has them: then the
        grouping runs on the host and nothing is read back from the device.
    The result lives on slot_ids' device, apart from the host-side ints.
    """
    _check(slot_ids, slot_ranks, host)
    if host is not None:
        return _from_host(*host, slot_ids.device)
    device = slot_ids.device
    num_slots = slot_ranks.numel()
    slots = slot_ids.to(torch.int64)
    ranks = slot_ranks.to(device=device, dtype=torch.int64)

    active = torch.nonzero(slots >= 0).squeeze(1)  # [num_active]
    active_slots = slots[active]
    used_ranks = ranks[active_slots]
    if active.numel() and int(used_ranks.min()) < 1:
        empty = int(active_slots[used_ranks < 1][0])
        raise ValueError(
            f"slot_ids: slot {empty} is used but slot_ranks[{empty}] is 0 (an empty slot)"
        )

    # One sort key orders by rank, then slot; stable, so a segment keeps token order.
    key = used_ranks * num_slots + active_slots
    _, perm = torch.sort(key, stable=True)
    token_order = active[perm]
    token_slots = active_slots[perm]
    token_slots32 = token_slots.to(torch.int32)  # the plan's and the kernel's (the same tensor)

    seg_slots, counts = torch.unique_consecutive(token_slots, return_counts=True)
    seg_starts = torch.zeros(seg_slots.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=seg_starts[1:])
    seg_ranks = ranks[seg_slots]

    return Segments(
        num_tokens=slot_ids.numel(),
        num_slots=num_slots,
        token_order=token_order,
        token_slots=token_slots32,
        seg_starts=seg_starts.to(torch.int32),
        seg_slots=seg_slots.to(torch.int32),
        seg_ranks=seg_ranks.to(torch.int32),
        max_segment_len=int(counts.max()) if counts.numel() else 0,
        max_rank=int(seg_ranks.max()) if seg_ranks.numel() else 0,
        cpu_plan=plan_cpu(
            token_order, token_slots32, seg_starts, seg_slots, seg_ranks, torch.get_num_threads()
        )
        if device.type == "cpu"
        else None,
    )


def group_slots(slots: Sequence[int], ranks: Sequence[int]) -> tuple[list[int], ...]:
    """build_segments' grouping on the host, as lists: (token_order, token_slots, seg_starts,
    seg_slots, seg_ranks), for callers that lay them out themselves."""
    active = [t for t, slot in enumerate(slots) if slot >= 0]
    empty = next((slots[t] for t in active if ranks[slots[t]] < 1), None)
    if empty is not None:
        raise ValueError(
            f"slot_ids: slot {empty} is used but slot_ranks[{empty}] is 0 (an empty slot)"
        )
    order = sorted(active, key=lambda t: (ranks[slots[t]], slots[t]))  # stable, as the sort
    token_slots = [slots[t] for t in order]
    seg_slots, seg_starts = [], [0]
    for slot, run in itertools.groupby(token_slots):
        seg_slots.append(slot)
        seg_starts.append(seg_starts[-1] + len(list(run)))
    return order, token_slots, seg_starts, seg_slots, [ranks[slot] for slot in seg_slots]


def _from_host(slots: Sequence[int], ranks: Sequence[int], device) -> Segments:
    """build_segments from the host lists: the same tensors, made on device."""
    order, token_slots, seg_starts, seg_slots, seg_ranks = group_slots(slots, ranks)
    counts = [b - a for a, b in itertools.pairwise(seg_starts)]
    tensor = lambda values, dtype: upload(torch.tensor(values, dtype=dtype), device)  # noqa: E731
    token_order = tensor(order, dtype=torch.int64)
    as_int32 = [
        tensor(x, dtype=torch.int32) for x in (token_slots, seg_starts, seg_slots, seg_ranks)
    ]
    cpu_plan = None
    if device.type == "cpu":
        cpu_plan = plan_cpu(token_order, as_int32[0], as_int32[1], as_int32[2], as_int32[3],
                            torch.get_num_threads(), host=(order, seg_starts, seg_slots, seg_ranks))  # fmt: skip
    return Segments(
        num_tokens=len(slots), num_slots=len(ranks), token_order=token_order,
        token_slots=as_int32[0], seg_starts=as_int32[1], seg_slots=as_int32[2],
        seg_ranks=as_int32[3], max_segment_len=max(counts, default=0),
        max_rank=max(seg_ranks, default=0), cpu_plan=cpu_plan,
    )  # fmt: skip


def _check(slot_ids: torch.Tensor, slot_ranks: torch.Tensor, host=None) -> None:
    for name, t in (("slot_ids", slot_ids), ("slot_ranks", slot_ranks)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer dtype, got {t.dtype}")
    num_slots = slot_ranks.numel()
    if host is not None:
        slots, ranks = host
        if len(slots) != slot_ids.numel() or len(ranks) != num_slots:
            raise ValueError("host: expected the lists of slot_ids and slot_ranks")
        lo, hi = min(slots, default=-1), max(slots, default=-1)
        if lo < -1 or hi >= num_slots:
            bad = lo if lo < -1 else hi
            raise ValueError(
                f"slot_ids: slot {bad} is out of range; expected -1 or 0..{num_slots - 1}"
            )
        if min(ranks, default=0) < 0:
            raise ValueError("slot_ranks: ranks must be >= 0")
        return
    if slot_ids.numel():
        lo, hi = int(slot_ids.min()), int(slot_ids.max())
        if lo < -1 or hi >= num_slots:
            bad = lo if lo < -1 else hi
            raise ValueError(
                f"slot_ids: slot {bad} is out of range; expected -1 or 0..{num_slots - 1}"
            )
    if num_slots and int(slot_ranks.min()) < 0:
        raise ValueError("slot_ranks: ranks must be >= 0")
