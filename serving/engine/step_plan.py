"""The one builder of a step's model inputs, from the scheduler's Python lists.

    seqs [A: 5 new tokens from position 0, B: 1 new token at position 9 (a decode)]
    token_ids      A0 A1 A2 A3 A4 B9
    positions       0  1  2  3  4  9
    slot_mapping   block_table[pos // block_size] * block_size + pos % block_size
    query_start    [0, 5, 6];  context_lens [5, 10]
    logits rows    the last `logits` rows of each sequence

The engine's step, the draft model's rounds and the tests all build their steps here. The
lists the tensors are made from go with them (StepInputs.host), so the model checks a step
and derives its attention metadata once, without reading anything back from the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import HostIndex
from serving.model.llama import StepInputs


@dataclass(frozen=True)
class StepSeq:
    """One sequence's share of a step: its new tokens, from position `start` on."""

    tokens: Sequence[int]
    start: int  # the first new token's position (the tokens before it have KV already)
    block_table: Sequence[int]
    adapter_slot: int = -1  # its adapter's slab slot; -1: base only
    logits: int = 1  # how many of its last rows want logits (0: none, a prefill chunk)


def build_step(seqs: Sequence[StepSeq], block_size: int, *, adapters: bool = True) -> StepInputs:
    """The model inputs of seqs, in order; adapters=False: no adapter_slots (no slab)."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    slot_ids: list[int] = []
    qsl, lens, rows = [0], [], []
    width = max(len(s.block_table) for s in seqs)
    tables = []
    for s in seqs:
        n, table = len(s.tokens), s.block_table
        ids += s.tokens
        positions = range(s.start, s.start + n)
        pos += positions
        slots += [table[p // block_size] * block_size + p % block_size for p in positions]
        slot_ids += [s.adapter_slot] * n
        qsl.append(qsl[-1] + n)
        lens.append(s.start + n)
        rows += range(qsl[-1] - s.logits, qsl[-1])
        tables.append((*table, *[0] * (width - len(table))))
    host_slots = tuple(slot_ids) if adapters else None
    host = HostIndex(tuple(qsl), tuple(lens), tuple(slots), tuple(tables), host_slots, tuple(rows))
    return StepInputs(
        token_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        logits_indices=torch.tensor(rows, dtype=torch.int64),
        adapter_slots=torch.tensor(slot_ids, dtype=torch.int32) if adapters else None,
        host=host,
    )
