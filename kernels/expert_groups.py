"""Per-step metadata for the grouped mixture-of-experts linear: rows grouped by (expert, slot).

A routed MoE batch has one row per (token, chosen expert) pair, and each row an adapter
slot (-1: base model only). `expert_linear` runs one group of rows at a time (the torch
path one matmul per expert run of rows, the Triton kernel tiles that never span groups),
reading an adapter's A and B once per group, so every sparse layer sorts its rows by
(expert, slot): `route_groups` sorts on the device and reads back only the groups' keys and
sizes; `group_routes` does the same from host lists.

Example (slot ranks [8, 4, 16], BLOCK_M = 16):
    expert per row   [1, 0, 1, 0, 1, 0]
    slot per row     [0, -1, 0, 2, -1, -1]
    order            [1, 5, 3, 4, 0, 2]      rows sorted by (expert, slot), stably
    groups           expert [0, 0, 1, 1]  slot [-1, 2, -1, 0]  start [0, 2, 3, 4]
                     length [2, 1, 1, 2]  rank [0, 16, 0, 8]  (rank 0: base only)
    tiles            group [0, 1, 2, 3]  first row [0, 2, 3, 4]
A group longer than BLOCK_M rows spans several tiles; the Triton kernel runs one program
per (tile, column tile), so it needs no search for its group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.device_tables import upload

TILE_ROWS = 16  # BLOCK_M of the kernel's row tiles: tl.dot needs 16, and decode groups are short


@dataclass(frozen=True)
class ExpertGroups:
    """Runs of sorted rows sharing one (expert, adapter slot); built by `group_routes`."""

    num_rows: int
    block_m: int  # rows per tile (the kernel's BLOCK_M), a power of two >= 16
    # [num_groups] int32 each, on the device; views of one table uploaded at once
    experts: torch.Tensor
    slots: torch.Tensor  # -1: base only
    starts: torch.Tensor  # first sorted row of each group
    lengths: torch.Tensor
    ranks: torch.Tensor  # rows of the slot's A and B to read; 0 where slot is -1
    # [num_tiles] int32: each BLOCK_M-row tile's group and first row (a tile never spans groups)
    tile_groups: torch.Tensor
    tile_rows: torch.Tensor
    # The same per-group values on the host, for the torch path and the checks.
    host_experts: tuple[int, ...]
    host_slots: tuple[int, ...]
    host_starts: tuple[int, ...]
    host_lengths: tuple[int, ...]
    host_ranks: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.host_experts)

    @property
    def num_tiles(self) -> int:
        return self.tile_groups.numel()

    @property
    def max_rank(self) -> int:
        """The largest rank any group reads (0 when none has an adapter)."""
        return max(self.host_ranks, default=0)


def group_routes(
    expert_ids: Sequence[int],
    slots: Sequence[int],
    slot_ranks: Sequence[int],
    device,
    *,
    block_m: int = TILE_ROWS,
) -> tuple[torch.Tensor, ExpertGroups]:
    """Sort rows by (expert, slot), stably: (order [N] int64, groups), x_sorted = x[order].

    expert_ids[n], slots[n]: row n's expert (>= 0) and adapter slot (-1: base only);
    slot_ranks[s]: the rank to read for slot s (0: the slot adds nothing). Host work only:
    the tables go to the device without the host waiting on it.
    """
    if len(expert_ids) != len(slots):
        raise ValueError(
            f"slots: expected one slot per row ({len(expert_ids)} expert_ids), got {len(slots)}"
        )
    if min(expert_ids, default=0) < 0:
        raise ValueError(f"expert_ids: expected experts >= 0, got {min(expert_ids)}")
    num_slots = len(slot_ranks)
    lo, hi = min(slots, default=-1), max(slots, default=-1)
    if lo < -1 or hi >= num_slots:
        bad = lo if lo < -1 else hi
        raise ValueError(f"slots: slot {bad} is out of range; expected -1 or 0..{num_slots - 1}")
    if min(slot_ranks, default=0) < 0:
        raise ValueError("slot_ranks: ranks must be >= 0")
    order = sorted(range(len(slots)), key=lambda n: (expert_ids[n], slots[n]))  # stable
    experts, group_slots, starts, lengths = [], [], [], []
    for i, n in enumerate(order):
        key = (expert_ids[n], slots[n])
        if not experts or key != (experts[-1], group_slots[-1]):
            experts.append(key[0])
            group_slots.append(key[1])
            starts.append(i)
            lengths.append(0)
        lengths[-1] += 1
    ranks = [slot_ranks[s] if s >= 0 else 0 for s in group_slots]
    groups = make_groups(experts, group_slots, starts, lengths, ranks, len(slots), device,
                         block_m=block_m)  # fmt: skip
    return upload(torch.tensor(order, dtype=torch.int64), device), groups


def route_groups(
    expert_ids: torch.Tensor,
    slots: torch.Tensor | None,
    slot_ranks: Sequence[int],
    *,
    block_m: int = TILE_ROWS,
) -> tuple[torch.Tensor, ExpertGroups]:
    """group_routes for device tensors: (order [N] int64, groups), sorted on the device.

    expert_ids: [N] integer; slots: [N] integer (-1: base only) or None (every row base
    only); slot_ranks[s]: the rank to read for slot s, 0 where the slot adds nothing here
    (its group is then base only). One read back: the G groups' keys and sizes.
    """
    num_slots = len(slot_ranks)
    key = expert_ids.to(torch.int64) * (num_slots + 1)  # [N]: (expert, slot + 1) as one int
    if slots is not None:
        key = key + slots.to(torch.int64) + 1
    sorted_keys, order = torch.sort(key, stable=True)
    uniq, counts = torch.unique_consecutive(sorted_keys, return_counts=True)  # [G] each
    pairs = torch.stack([uniq, counts]).tolist()  # the one read back
    experts = [k // (num_slots + 1) for k in pairs[0]]
    group_slots = [k % (num_slots + 1) - 1 for k in pairs[0]]
    ranks = [slot_ranks[s] if s >= 0 else 0 for s in group_slots]
    group_slots = [s if r > 0 else -1 for s, r in zip(group_slots, ranks)]
    starts = [0]
    for c in pairs[1][:-1]:
        starts.append(starts[-1] + c)
    groups = make_groups(experts, group_slots, starts[: len(experts)], pairs[1], ranks,
                         expert_ids.numel(), expert_ids.device, block_m=block_m)  # fmt: skip
    return order, groups


def make_groups(
    experts: Sequence[int],
    slots: Sequence[int],
    starts: Sequence[int],
    lengths: Sequence[int],
    ranks: Sequence[int],
    num_rows: int,
    device,
    *,
    block_m: int = TILE_ROWS,
) -> ExpertGroups:
    """ExpertGroups from per-group host lists (group_routes' result; tests build odd ones).

    A group of length 0 gets no tile; a group with slot -1 gets rank 0.
    """
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m: expected a power of two >= 16, got {block_m}")
    num_groups = len(experts)
    if not all(len(v) == num_groups for v in (slots, starts, lengths, ranks)):
        raise ValueError("groups: expected experts, slots, starts, lengths, ranks of one length")
    ranks = [r if s >= 0 else 0 for s, r in zip(slots, ranks)]
    tile_groups, tile_rows = [], []
    for g, (start, length) in enumerate(zip(starts, lengths)):
        for row in range(start, start + length, block_m):
            tile_groups.append(g)
            tile_rows.append(row)
    columns = (experts, slots, starts, lengths, ranks, tile_groups, tile_rows)
    # One host-to-device copy for all seven tables; the fields are views of it.
    table = upload(torch.tensor([v for c in columns for v in c], dtype=torch.int32), device)
    parts = table.split([len(c) for c in columns])
    return ExpertGroups(
        num_rows=num_rows, block_m=block_m, experts=parts[0], slots=parts[1], starts=parts[2],
        lengths=parts[3], ranks=parts[4], tile_groups=parts[5], tile_rows=parts[6],
        host_experts=tuple(experts), host_slots=tuple(slots), host_starts=tuple(starts),
        host_lengths=tuple(lengths), host_ranks=tuple(ranks),
    )  # fmt: skip
