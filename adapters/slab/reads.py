"""What the model runtime reads from the slab, per layer and module: stacks, ranks, vectors.

A mixin of AdapterSlab (adapters/slab/slab.py), which sets `stacks` (adapters/slab/stacks.py)
and `vectors` (adapters/slab/vectors.py); the slab's pinning lives there, its loading in
adapters/slab/loading.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.slab.stacks import SlabStacks
from adapters.slab.vectors import SlabVectors


class SlabReads:
    """The slab's tensors as a step reads them: slots are first pages (see slab_stacks)."""

    stacks: SlabStacks
    vectors: SlabVectors

    def lora_a(self, layer: int, module: str) -> torch.Tensor:
        """The A stack of (layer, module): [num_slots, max_rank, in], a paged view."""
        return self.stacks.a[layer, module]

    def lora_b(self, layer: int, module: str) -> torch.Tensor:
        """The B stack of (layer, module), B transposed per slot: [num_slots, max_rank, out]."""
        return self.stacks.b[layer, module]

    def expert_stacks(self, layer: int, proj: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's A and B stacks of (layer, proj), [E, num_slots, max_rank, in] and
        [E, num_slots, max_rank, out], paged views (kernels/expert_linear.py reads them)."""
        return self.stacks.experts[layer, proj]

    def expert_host_ranks(self, layer: int) -> list[int]:
        """Per slot, the most rows of any expert of layer its adapter adapts (0: none), as a
        list updated in place: the rank an expert group of that slot reads."""
        return self.stacks.expert_ranks[layer]

    def serves_outer(self, module: str) -> bool:
        """Whether some slot's adapter has LoRA on module: a step skips its LoRA if none."""
        return self.stacks.ranks.serves_outer(module)

    def module_ranks(self, layer: int, modules: Sequence[str]) -> torch.Tensor:
        """Each module's own rank per slot, [len(modules), num_slots] (kernels' slice_ranks)."""
        return self.stacks.ranks.of(layer, modules)

    def module_host_ranks(self, layer: int, modules: Sequence[str]) -> list[list[int]]:
        """module_ranks as lists, read with no device sync."""
        return self.stacks.ranks.host_of(layer, modules)

    def lora_bias(self, layer: int, module: str) -> torch.Tensor:
        """scale * lora_B's bias per slot for (layer, module): [num_slots, out]."""
        return self.vectors.bias[layer, module]

    def lora_dora(self, layer: int, module: str) -> torch.Tensor:
        """DoRA's output scale per slot for (layer, module): [num_slots, out] (1: none)."""
        return self.vectors.dora[layer, module]
