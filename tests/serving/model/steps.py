"""Building StepInputs by hand for model tests: sequences, their blocks and their new tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from serving.model.step_plan import StepInputs, StepSeq, build_step


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
    parts = []
    for s in seqs:
        pool.grow(s, block_size)
        new = s.tokens[s.cached :]
        parts.append(StepSeq(new, s.cached, s.blocks, s.slot, len(new) if all_logits else 1))
    step = build_step(parts, block_size)
    for s in seqs:
        s.cached = len(s.tokens)
    return step
