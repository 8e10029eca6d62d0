"""What each page of the adapter slab holds for the kernels, and how an adapter's pages are
filled or emptied.

    stacks   LoRA A and B per (layer, module), paged, and each module's rank (adapters/slab/stacks.py)
    vectors  lora_B biases and DoRA's output scales (adapters/slab/vectors.py)
    tokens   the trainable-token slots, and each page's (adapters/slab/tokens.py)
    scales   [pages] float32, ranks [pages] int32, and both as host lists

An adapter's slot is its first page: its scale, rank, vectors and flags are there, and its
other pages (continuation pages) keep rank 0 and scale 0 in every per-page table, as no
token names them. A load fills pages the slab reserved for it with `write`, outside the
slab's lock: no reader touches them until `publish`, under the lock, sets the flags and
counts every step reads and, last, the slot's rank. `clear` empties a slot, under the lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec, expert_of
from adapters.slab.stacks import SlabStacks
from adapters.slab.tokens import SlabTokens
from adapters.slab.vectors import BaseWeight, SlabVectors


class SlotContents:
    """Every page's weights, vectors, scale and rank (rank 0: no adapter's slot), and the
    trainable-token slots."""

    def __init__(
        self,
        spec: BaseModelSpec,
        modules: Sequence[str],
        outer: Sequence[str],
        *,
        num_pages: int,
        page_rank: int,
        max_rank: int,
        max_tokens: int,
        token_slots: int,
        base_weight: BaseWeight | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        like = {"dtype": dtype, "device": device}
        self.stacks = SlabStacks(spec, modules, outer, num_pages, page_rank, max_rank, **like)
        # no lora_bias or DoRA on an expert (refused on reading): experts get no vectors
        shapes = ((key, fan_out) for key, (_, fan_out) in self.stacks.shapes.items()
                  if expert_of(key[1]) is None)  # fmt: skip
        self.vectors = SlabVectors(shapes, num_pages, base_weight=base_weight, **like)
        self.tokens = SlabTokens(num_pages, spec.vocab_size, spec.hidden_size, max_tokens,
                                 num_slots=token_slots, **like)  # fmt: skip
        self.scales = torch.zeros(num_pages, dtype=torch.float32, device=device)  # [pages]
        self.ranks = torch.zeros(num_pages, dtype=torch.int32, device=device)  # [pages]
        # The same as lists, for steps to group tokens and scale runs on the host
        self.host_ranks, self.host_scales = [0] * num_pages, [0.0] * num_pages

    def check(self, version: str, adapter: Adapter) -> None:
        """AdapterError if adapter's vectors or trainable tokens cannot be held."""
        self.vectors.check(version, adapter)
        self.tokens.check(version, adapter)

    def write(self, slot: int, adapter: Adapter, token_slot: int | None) -> None:
        """Fill the pages from slot on with adapter's stacks, and slot's bias and DoRA
        vectors and scale; its trainable tokens into token_slot (None: it has none)."""
        self.stacks.write(slot, adapter)
        self.vectors.write(slot, adapter)
        if token_slot is not None:
            self.tokens.write(token_slot, adapter)
        self.scales[slot] = adapter.scale
        self.host_scales[slot] = adapter.scale

    def publish(self, slot: int, adapter: Adapter, token_slot: int | None) -> None:
        """Make the written slot readable: its flags and counts, then its rank (hold the lock)."""
        self.vectors.mark(slot, adapter)
        self.tokens.mark(slot, token_slot)
        self.stacks.ranks.mark(slot)
        self.host_ranks[slot] = adapter.rank
        self.ranks[slot] = adapter.rank  # last: the kernels read the slot from here on

    def clear(self, slot: int, token_slot: int | None) -> None:
        """Empty slot: rank and scale 0, no vectors, module ranks or outer modules, and its
        token slot, if any, emptied (hold the lock)."""
        self.ranks[slot] = 0
        self.host_ranks[slot] = 0
        self.scales[slot] = 0.0
        self.host_scales[slot] = 0.0
        self.vectors.mark(slot, None)
        self.tokens.mark(slot, None)
        if token_slot is not None:
            self.tokens.write(token_slot, None)
        self.stacks.ranks.clear(slot)
