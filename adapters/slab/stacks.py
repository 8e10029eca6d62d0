"""The slab's A and B stacks, per layer and module, and each module's rank per page.

The slab is `num_pages` pages of `page_rank` rows; a rank-r adapter holds ceil(r / page_rank)
contiguous pages, and its slot (the index the kernels take) is its first page. Each stack is
stored as rows, (num_pages - 1) * page_rank + max_rank of them, and exposed as an
overlapping view whose slot p starts at row p * page_rank and reaches max_rank rows:

    A[num_pages, max_rank, in]    strides (page_rank * in, in, 1): lora_A ([r, in]) in rows :r
    B[num_pages, max_rank, out]   lora_B TRANSPOSED ([out, r] -> [r, out]) in rows :r

so `A[slot, :r]` is exactly the adapter's rows, and a kernel that reads stack[slot, :rank]
reads nothing of another adapter's pages. A module whose own scale differs from the
adapter's (alpha_pattern, rank_pattern) has its B stored multiplied by the ratio, so the
kernels keep one scale per slot; a module of a lower rank than its adapter's fills only its
first rows, the rest zero, and its rank is in `ranks` (adapters/slab/ranks.py) for the
kernels to stop at. With `outer`, the embedding's and LM head's stacks are kept under layer
-1; the embedding's A is stored [vocab, rows], so that its shrink, a gather of column
id(t) per token, reads contiguous memory: its view [num_pages, max_rank, vocab] has strides
(page_rank, 1, rows). A mixture of experts' per-expert stacks of one (layer, projection)
share one tensor, [E, rows, width], so that a grouped kernel reads every expert's from one
base: `experts[(layer, proj)]` is it viewed [E, num_pages, max_rank, width].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec, expert_of
from adapters.format.tensor_names import OUTER_LAYER
from adapters.slab.ranks import SlabRanks

Key = tuple[int, str]  # (layer, module)


class SlabStacks:
    """Every (layer, module)'s A and B stacks, as paged views, and the module ranks per page."""

    def __init__(
        self,
        spec: BaseModelSpec,
        modules: Sequence[str],
        outer: Sequence[str],
        num_pages: int,
        page_rank: int,
        max_rank: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        like = {"dtype": dtype, "device": device}
        self.num_pages, self.max_rank, self.page_rank = num_pages, max_rank, page_rank
        rows = (num_pages - 1) * page_rank + max_rank  # the last page's view ends at the last row
        self.shapes: dict[Key, tuple[int, int]] = {
            (layer, m): spec.shapes[m] for layer in range(spec.num_layers) for m in modules
        }
        self.shapes.update({(OUTER_LAYER, m): spec.outer_shapes[m] for m in outer})
        size = (num_pages, max_rank)
        self.a: dict[Key, torch.Tensor] = {}  # [num_pages, max_rank, in], paged
        self.b: dict[Key, torch.Tensor] = {}  # [num_pages, max_rank, out], paged
        # (layer, proj) -> every expert's A and B stacks of it as one [E, num_pages, max_rank,
        # width] view, the grouped expert kernels' (kernels/expert_linear.py) operands
        self.experts: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}
        # layer -> per slot, the most rows any expert of the slot's adapter has there (0: no
        # expert LoRA in that layer, so its rows skip the LoRA: the grouping's slot_ranks)
        self.expert_ranks: dict[int, list[int]] = {}
        num_experts = spec.num_experts
        for key, (fan_in, fan_out) in self.shapes.items():
            expert = expert_of(key[1])
            if expert is not None:  # each expert's stacks are views of its projection's
                self._expert_views(key, expert, num_experts, (fan_in, fan_out), rows, like)
                continue
            if key == (OUTER_LAYER, "embed_tokens"):  # [vocab, rows]: a row's columns adjacent
                stored = torch.zeros(fan_in, rows, **like)
                self.a[key] = stored.as_strided((*size, fan_in), (page_rank, 1, rows))
            else:
                stored = torch.zeros(rows, fan_in, **like)
                self.a[key] = stored.as_strided((*size, fan_in), (page_rank * fan_in, fan_in, 1))
            stored = torch.zeros(rows, fan_out, **like)
            self.b[key] = stored.as_strided((*size, fan_out), (page_rank * fan_out, fan_out, 1))
        self.ranks = SlabRanks(spec.num_layers, modules, outer, num_pages, device)
        self.page_rank = page_rank
        # Per page, the keys whose rows there may be nonzero (a tenant wrote them, and no
        # write zeroed them since): a load zeroes only those, so a q/v adapter replacing a
        # q/v adapter writes its own rows and nothing else. Eviction zeroes nothing.
        self._dirty: list[set[Key]] = [set() for _ in range(num_pages)]

    def _expert_views(self, key: Key, expert, num_experts: int, shape, rows: int, like) -> None:
        """Expert e's A and B stacks as views of [E, rows, width] tensors shared by every
        expert of (layer, proj), made on the first expert seen."""
        (e, proj), layer = expert, key[0]
        if (layer, proj) not in self.experts:
            grouped = []
            for width in shape:
                stored = torch.zeros(num_experts, rows, width, **like)
                grouped.append(stored.as_strided(
                    (num_experts, self.num_pages, self.max_rank, width),
                    (rows * width, self.page_rank * width, width, 1),
                ))  # fmt: skip
            self.experts[layer, proj] = (grouped[0], grouped[1])
            self.expert_ranks.setdefault(layer, [0] * self.num_pages)
        a, b = self.experts[layer, proj]
        self.a[key], self.b[key] = a[e], b[e]  # [num_pages, max_rank, width], paged

    def write(self, slot: int, adapter: Adapter) -> None:
        """A[slot, :r_m] = a; B[slot, :r_m] = (s_m / s) * b.T; rows r_m: zeroed (all of them
        where the adapter has no module), up to the adapter's rank r."""
        r = adapter.rank
        pages = range(slot, slot + -(-r // self.page_rank))
        whole = range(slot, slot + r // self.page_rank)  # pages rows :r cover entirely
        most = dict.fromkeys(self.expert_ranks, 0)  # layer -> its experts' largest rank
        # Plain copies on the current stream: they queue behind kernels still reading these
        # pages' previous tenants, so an eviction never races a step already launched.
        for key, a_stack in self.a.items():
            b_stack = self.b[key]
            mod = adapter.modules.get(key)
            dirty = any(key in self._dirty[p] for p in pages)
            if mod is None:  # untargeted: its update must be exactly 0, not stale rows
                if dirty:
                    a_stack[slot, :r].zero_()
                    b_stack[slot, :r].zero_()
                    for p in whole:
                        self._dirty[p].discard(key)
                self.ranks.set(key, slot, 0)
                continue
            rm = mod.a.shape[0]
            self.ranks.set(key, slot, rm)
            if key[0] in most and expert_of(key[1]) is not None:
                most[key[0]] = max(most[key[0]], rm)
            a_stack[slot, :rm].copy_(mod.a)  # [rm, in]
            if mod.scale == adapter.scale:
                b_stack[slot, :rm].copy_(mod.b.T)  # [out, rm] -> [rm, out]
            else:  # in float32, then once into the slab's dtype
                b_stack[slot, :rm].copy_(mod.b.T.to(torch.float32) * (mod.scale / adapter.scale))
            if rm < r and dirty:
                a_stack[slot, rm:r].zero_()
                b_stack[slot, rm:r].zero_()
            for p in pages:
                self._dirty[p].add(key)
        for layer, rank in most.items():
            self.expert_ranks[layer][slot] = rank
