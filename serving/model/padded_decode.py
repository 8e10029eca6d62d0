"""A decode step padded to a fixed batch size, as one flat int64 buffer of fixed layout.

A CUDA graph replays fixed shapes reading fixed addresses, so a decode step of n sequences
runs as a batch of `size` >= n: its index values are written into one buffer per size, at
fixed offsets, with one host-to-device copy, and the captured kernels read them there.

    ids | positions | kv slots | context lens | query starts (size + 1) | adapter slots
    | token order | token slots | segment starts (size + 1) | segment slots | segment ranks
    | block tables (size x width)

Padding rows are base-only sequences of one token at position 0, whose one key is in a
scratch block no sequence owns: they attend to a finite key and write nowhere a real
sequence reads. Padding segments are empty (start == end, rank 0), so the LoRA kernels'
programs for them return at once; the grids are sized by `size`, a bound known on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import HostIndex, Segments
from kernels.attention_plan import AttentionPlan, KVWrites
from kernels.segments import group_slots

FIELDS = ("ids", "positions", "slots", "context_lens", "query_starts", "adapter_slots",
          "token_order", "token_slots", "seg_starts", "seg_slots", "seg_ranks")  # fmt: skip
_PLUS_ONE = {"query_starts", "seg_starts"}


def is_decode(host: HostIndex | None) -> bool:
    """Whether the step is one new token per sequence, each wanting its logits."""
    if host is None:
        return False
    n = len(host.context_lens)
    return host.query_starts == tuple(range(n + 1)) and host.logits_rows == tuple(range(n))


def layout(size: int, width: int) -> dict[str, tuple[int, int]]:
    """field -> (offset, length) in the flat buffer of a batch of `size`, tables `width` wide."""
    spans, at = {}, 0
    for name in FIELDS:
        n = size + 1 if name in _PLUS_ONE else size
        spans[name], at = (at, n), at + n
    spans["block_tables"] = (at, size * width)
    return spans


def buffer_len(size: int, width: int) -> int:
    offset, n = layout(size, width)["block_tables"]
    return offset + n


@dataclass(frozen=True)
class Padding:
    size: int  # the batch size padded to
    width: int  # block-table width (blocks per sequence at the longest context)
    scratch_block: int  # a KV block no sequence owns
    block_size: int


def padded_values(
    pad: Padding, ids: Sequence[int], positions: Sequence[int], host: HostIndex,
    slot_ranks: Sequence[int] | None,
) -> list[int]:  # fmt: skip
    """The flat buffer's values for a decode step of n <= pad.size sequences.

    ids, positions: each sequence's new token and its position; host: the step's lists;
    slot_ranks: the rank of the adapter in each slab slot (None: no slab).
    """
    size, n = pad.size, len(ids)
    extra = size - n
    if extra < 0 or len(host.block_tables[0] if n else ()) > pad.width:
        raise ValueError(f"a decode step of {n} sequences does not fit batch size {size}")
    scratch_slot = pad.scratch_block * pad.block_size
    adapter = list(host.adapter_slots) if host.adapter_slots is not None else [-1] * n
    values = {
        "ids": [*ids, *[0] * extra],
        "positions": [*positions, *[0] * extra],
        "slots": [*host.slots, *[scratch_slot] * extra],
        "context_lens": [*host.context_lens, *[1] * extra],
        "query_starts": list(range(size + 1)),
        "adapter_slots": adapter + [-1] * extra,
        **_segments(adapter, slot_ranks, size),
    }
    tables = [(*row, *[0] * (pad.width - len(row))) for row in host.block_tables]
    tables += [(pad.scratch_block, *[0] * (pad.width - 1))] * extra
    flat = [v for name in FIELDS for v in values[name]]
    return flat + [b for row in tables for b in row]


def _segments(slots: list[int], ranks: Sequence[int] | None, size: int) -> dict[str, list[int]]:
    """build_segments' grouping of slots, padded: empty segments of rank 0 past the real ones."""
    if ranks is None:
        if max(slots, default=-1) >= 0:
            raise ValueError("adapter slots are given but there is no slab")
        ranks = ()
    order, token_slots, starts, seg_slots, seg_ranks = group_slots(slots, ranks)
    num = len(seg_slots)
    return {
        "token_order": order + [0] * (size - len(order)),
        "token_slots": token_slots + [0] * (size - len(order)),
        "seg_starts": starts + [starts[-1]] * (size - num),
        "seg_slots": seg_slots + [0] * (size - num),
        "seg_ranks": seg_ranks + [0] * (size - num),
    }


@dataclass(frozen=True)
class StaticViews:
    """The buffer's fields as tensors: what a captured forward reads."""

    fields: dict[str, torch.Tensor]
    block_tables: torch.Tensor  # [size, width]
    logits_indices: torch.Tensor  # [size] arange: every row's logits

    def attention(self) -> AttentionPlan:
        """The attention plan of any decode step held in the buffer (CUDA: the Triton kernel
        reads the tables on the device; one query per sequence)."""
        f = self.fields
        return AttentionPlan((), (), self.block_tables, f["context_lens"], f["query_starts"],
                             1, None, (), KVWrites(None, f["slots"]))  # fmt: skip

    def segments(self, num_slots: int, max_rank: int) -> Segments:
        """Segments over the buffer: `size` segments (the padding ones empty), each up to
        `size` tokens long, the grid bounds of the LoRA kernels."""
        f = self.fields
        size = f["ids"].numel()
        return Segments(size, num_slots, f["token_order"], f["token_slots"], f["seg_starts"],
                        f["seg_slots"], f["seg_ranks"], size, max_rank, None)  # fmt: skip


def static_views(buffer: torch.Tensor, size: int, width: int) -> StaticViews:
    """Views of `buffer` ([buffer_len] int64) by the layout of a batch of `size`."""
    spans = layout(size, width)
    fields = {name: buffer[o : o + n] for name, (o, n) in spans.items() if name in FIELDS}
    o, n = spans["block_tables"]
    indices = torch.arange(size, device=buffer.device)
    return StaticViews(fields, buffer[o : o + n].view(size, width), indices)
