"""What each slot of the adapter slab holds for the kernels, and how a slot is filled or emptied.

    stacks   LoRA A and B per (layer, module), and each module's rank (adapters/slab_stacks.py)
    vectors  lora_B biases and DoRA's output scales (adapters/slab_vectors.py)
    tokens   trainable-token rows (adapters/slab_tokens.py)
    scales   [slots] float32, ranks [slots] int32, and both as host lists

A load fills a slot that the slab reserved for it with `write`, outside the slab's lock: no
reader touches that slot until `publish`, under the lock, sets the flags and counts every
step reads and, last, the slot's rank. `clear` empties a slot, under the lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.base_model import BaseModelSpec
from adapters.format import Adapter
from adapters.slab_stacks import SlabStacks
from adapters.slab_tokens import SlabTokens
from adapters.slab_vectors import BaseWeight, SlabVectors


class SlotContents:
    """Every slot's weights, vectors, tokens, scale and rank (rank 0: an empty slot)."""

    def __init__(
        self,
        spec: BaseModelSpec,
        modules: Sequence[str],
        outer: Sequence[str],
        *,
        num_slots: int,
        max_rank: int,
        max_tokens: int,
        base_weight: BaseWeight | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        like = {"dtype": dtype, "device": device}
        self.stacks = SlabStacks(spec, modules, outer, num_slots, max_rank, **like)
        shapes = ((key, fan_out) for key, (_, fan_out) in self.stacks.shapes.items())
        self.vectors = SlabVectors(shapes, num_slots, base_weight=base_weight, **like)
        self.tokens = SlabTokens(num_slots, spec.vocab_size, spec.hidden_size, max_tokens, **like)
        self.scales = torch.zeros(num_slots, dtype=torch.float32, device=device)  # [slots]
        self.ranks = torch.zeros(num_slots, dtype=torch.int32, device=device)  # [slots]
        # The same as lists, for steps to group tokens and scale runs on the host
        self.host_ranks, self.host_scales = [0] * num_slots, [0.0] * num_slots

    def check(self, version: str, adapter: Adapter) -> None:
        """AdapterError if adapter's vectors or trainable tokens cannot be held."""
        self.vectors.check(version, adapter)
        self.tokens.check(version, adapter)

    def write(self, slot: int, adapter: Adapter) -> None:
        """Fill slot's stacks, bias and DoRA vectors, trainable tokens and scale."""
        self.stacks.write(slot, adapter)
        self.vectors.write(slot, adapter)
        self.tokens.write(slot, adapter)
        self.scales[slot] = adapter.scale
        self.host_scales[slot] = adapter.scale

    def publish(self, slot: int, adapter: Adapter) -> None:
        """Make the written slot readable: its flags and counts, then its rank (hold the lock)."""
        self.vectors.mark(slot, adapter)
        self.tokens.mark(slot, adapter)
        self.stacks.ranks.mark(slot)
        self.host_ranks[slot] = adapter.rank
        self.ranks[slot] = adapter.rank  # last: the kernels read the slot from here on

    def clear(self, slot: int) -> None:
        """Empty slot: rank and scale 0, no vectors, tokens or outer modules (hold the lock)."""
        self.ranks[slot] = 0
        self.host_ranks[slot] = 0
        self.scales[slot] = 0.0
        self.host_scales[slot] = 0.0
        self.vectors.mark(slot, None)
        self.tokens.mark(slot, None)
        self.tokens.write(slot, None)
        self.stacks.ranks.clear(slot)
