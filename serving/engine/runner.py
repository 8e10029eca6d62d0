"""From a schedule to the model's StepInputs, and back to one set of logits per finished prefill.

scheduled [A: 5 new tokens from 0, B: 1 new token at 9 (decode)]
token_ids      A0 A1 A2 A3 A4 B9
positions       0  1  2  3  4  9
slot_mapping   block_table[pos // block_size] * block_size + pos % block_size
query_start    [0, 5, 6];  context_lens [5, 10]
logits rows    [4, 5]  (A's prompt is complete; a chunk that is not yet complete gets none)

A decoding sequence with proposals d1..dk also feeds them, at the positions after its last
token, and gets k + 1 logits rows: the target scores every proposal in this one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving.engine.scheduler import Scheduled
from serving.model.llama import StepInputs


@dataclass(frozen=True)
class Batch:
    inputs: StepInputs
    sampled: list[Scheduled]  # the sequences that get a token this step, in logits-row order
    first_rows: list[int]  # per sampled sequence, its first row in the logits (k + 1 rows each)


def build_batch(
    scheduled: list[Scheduled],
    block_size: int,
    slot_of,
    proposals: dict[int, list[int]] | None = None,
) -> Batch:
    """slot_of(version) -> the adapter's slab slot (the version is resident and pinned).

    proposals: seq_id -> proposed tokens, for decoding sequences whose blocks have room.
    """
    proposals = proposals or {}
    ids, pos, slots, adapters, qsl, rows, sampled, first_rows = [], [], [], [], [0], [], [], []
    width = max(len(s.seq.block_table) for s in scheduled)
    tables = []
    for item in scheduled:
        seq, start = item.seq, item.seq.num_cached_tokens
        drafts = proposals.get(seq.seq_id, [])
        tokens = seq.token_ids[start : start + item.num_new_tokens] + drafts
        n = len(tokens)
        adapter_slot = slot_of(seq.request.adapter) if seq.request.adapter else -1
        table = seq.block_table
        for p, token in enumerate(tokens, start):
            ids.append(token)
            pos.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
        adapters += [adapter_slot] * n
        qsl.append(qsl[-1] + n)
        tables.append(table + [0] * (width - len(table)))
        if start + item.num_new_tokens == seq.num_tokens:  # all in: sample the next token
            first_rows.append(len(rows))
            rows.extend(range(qsl[-1] - 1 - len(drafts), qsl[-1]))
            sampled.append(item)
    inputs = StepInputs(
        token_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        context_lens=torch.tensor(qsl[1:], dtype=torch.int32)
        - torch.tensor(qsl[:-1], dtype=torch.int32)
        + torch.tensor([s.seq.num_cached_tokens for s in scheduled], dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        logits_indices=torch.tensor(rows, dtype=torch.int64),
        adapter_slots=torch.tensor(adapters, dtype=torch.int32),
    )
    return Batch(inputs=inputs, sampled=sampled, first_rows=first_rows)
