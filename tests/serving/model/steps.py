"""Building StepInputs by hand for model tests: sequences, their blocks and their new tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from serving.model.llama import StepInputs


@dataclass
class Seq:
    tokens: list[int]  # every token so far, cached and new
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens already in the cache
    slot: int = -1  # adapter slab slot, -1 = base only


class BlockPool:
    """Hands out KV blocks in a shuffled order, so block tables are not contiguous."""

    def __init__(self, num_blocks: int, seed: int = 0):
        self.free = torch.randperm(
            num_blocks, generator=torch.Generator().manual_seed(seed)
        ).tolist()

    def grow(self, seq: Seq, block_size: int) -> None:
        while len(seq.blocks) * block_size < len(seq.tokens):
            seq.blocks.append(self.free.pop())


def step_for(
    seqs: list[Seq], block_size: int, pool: BlockPool, all_logits: bool = True
) -> StepInputs:
    """A step computing every uncached token of every seq; logits for all new rows (or last)."""
    ids, pos, slots, adapters, qsl, logits = [], [], [], [], [0], []
    for s in seqs:
        pool.grow(s, block_size)
        new = range(s.cached, len(s.tokens))
        for p in new:
            ids.append(s.tokens[p])
            pos.append(p)
            slots.append(s.blocks[p // block_size] * block_size + p % block_size)
            adapters.append(s.slot)
        start = qsl[-1]
        qsl.append(start + len(new))
        logits += list(range(start, qsl[-1])) if all_logits else [qsl[-1] - 1]
    width = max(len(s.blocks) for s in seqs)
    tables = torch.tensor(
        [s.blocks + [0] * (width - len(s.blocks)) for s in seqs], dtype=torch.int32
    )
    step = StepInputs(
        token_ids=torch.tensor(ids),
        positions=torch.tensor(pos),
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        context_lens=torch.tensor([len(s.tokens) for s in seqs], dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        logits_indices=torch.tensor(logits),
        adapter_slots=torch.tensor(adapters, dtype=torch.int32),
    )
    for s in seqs:
        s.cached = len(s.tokens)
    return step
