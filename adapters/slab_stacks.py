"""The slab's A and B stacks, per layer and module, and each module's rank per slot.

    A[num_slots, max_rank, in]    a rank-r adapter's lora_A ([r, in]) in rows :r of its slot
    B[num_slots, max_rank, out]   its lora_B TRANSPOSED ([out, r] -> [r, out]) in rows :r

A module whose own scale differs from the adapter's (alpha_pattern, rank_pattern) has its
B stored multiplied by the ratio, so the kernels keep one scale per slot; a module of a
lower rank than its adapter's fills only its first rows, the rest zero, and its rank is in
`ranks` (adapters/slab_ranks.py) for the kernels to stop at. With `outer`, the embedding's
and LM head's stacks are kept under layer -1; the embedding's A is stored [slots, vocab,
rank], so that its shrink, a gather of column id(t) per token, reads contiguous memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.base_model import BaseModelSpec
from adapters.format import Adapter
from adapters.slab_ranks import SlabRanks
from adapters.tensor_names import OUTER_LAYER

Key = tuple[int, str]  # (layer, module)


class SlabStacks:
    """Every (layer, module)'s A and B stacks, and the module ranks of every slot."""

    def __init__(
        self,
        spec: BaseModelSpec,
        modules: Sequence[str],
        outer: Sequence[str],
        num_slots: int,
        max_rank: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        like = {"dtype": dtype, "device": device}
        self.shapes: dict[Key, tuple[int, int]] = {
            (layer, m): spec.shapes[m] for layer in range(spec.num_layers) for m in modules
        }
        self.shapes.update({(OUTER_LAYER, m): spec.outer_shapes[m] for m in outer})
        self.a: dict[Key, torch.Tensor] = {}  # [num_slots, max_rank, in]
        self.b: dict[Key, torch.Tensor] = {}  # [num_slots, max_rank, out]
        for key, (fan_in, fan_out) in self.shapes.items():
            if key == (OUTER_LAYER, "embed_tokens"):  # a [slots, rank, vocab] view of it
                stored = torch.zeros(num_slots, fan_in, max_rank, **like)
                self.a[key] = stored.transpose(1, 2)
            else:
                self.a[key] = torch.zeros(num_slots, max_rank, fan_in, **like)
            self.b[key] = torch.zeros(num_slots, max_rank, fan_out, **like)
        self.ranks = SlabRanks(spec.num_layers, modules, outer, num_slots, device)

    def write(self, slot: int, adapter: Adapter) -> None:
        """A[slot, :r_m] = a; B[slot, :r_m] = (s_m / s) * b.T; rows r_m: zeroed (all of them
        where the adapter has no module), up to the adapter's rank r."""
        r = adapter.rank
        # Plain copies on the current stream: they queue behind kernels still reading this
        # slot's previous tenant, so an eviction never races a step already launched.
        for key, a_stack in self.a.items():
            b_stack = self.b[key]
            mod = adapter.modules.get(key)
            if mod is None:  # untargeted: its update must be exactly 0, not stale rows
                a_stack[slot, :r].zero_()
                b_stack[slot, :r].zero_()
                self.ranks.set(key, slot, 0)
                continue
            rm = mod.a.shape[0]
            self.ranks.set(key, slot, rm)
            a_stack[slot, :rm].copy_(mod.a)  # [rm, in]
            if mod.scale == adapter.scale:
                b_stack[slot, :rm].copy_(mod.b.T)  # [out, rm] -> [rm, out]
            else:  # in float32, then once into the slab's dtype
                b_stack[slot, :rm].copy_(mod.b.T.to(torch.float32) * (mod.scale / adapter.scale))
            a_stack[slot, rm:r].zero_()
            b_stack[slot, rm:r].zero_()
