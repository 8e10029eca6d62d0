"""Each module's own rank per page, the kernels' `slice_ranks` (kernels/lora_ops.py).

    table[layer]: [modules of the layer, num_pages] int32   rank_pattern's rank, 0 where the
                                                           adapter leaves the module out

An adapter's ranks are in the column of its slot, its first page; every other page's
column is 0 (no token names a continuation page).

Fused modules (q|k|v, gate|up) are adjacent rows, so a projection's table is a view. The
embedding's and LM head's ranks sit under layer -1, with which slots use them, so a step
where no slot does skips their LoRA altogether.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.format.tensor_names import OUTER_LAYER


class SlabRanks:
    """Module ranks per page for every layer the slab holds."""

    def __init__(
        self, num_layers: int, modules: Sequence[str], outer: Sequence[str], num_pages: int, device
    ) -> None:
        self._index = {m: i for i, m in enumerate(modules)}
        self._index.update({m: i for i, m in enumerate(outer)})
        layers = [(layer, modules) for layer in range(num_layers)]
        layers += [(OUTER_LAYER, outer)] if outer else []
        self._table = {
            layer: torch.zeros(len(names), num_pages, dtype=torch.int32, device=device)
            for layer, names in layers
        }
        # The same tables as lists, for the CPU path's loops (read with no device sync).
        self._host = {layer: [[0] * num_pages for _ in names] for layer, names in layers}
        self._outer_slots: dict[str, set[int]] = {m: set() for m in outer}

    def of(self, layer: int, modules: Sequence[str]) -> torch.Tensor:
        """[len(modules), num_pages] int32; a view when the modules are adjacent rows."""
        first = self._index[modules[0]]
        table = self._table[layer]
        if [self._index[m] for m in modules] == list(range(first, first + len(modules))):
            return table[first : first + len(modules)]
        return torch.stack([table[self._index[m]] for m in modules])

    def host_of(self, layer: int, modules: Sequence[str]) -> list[list[int]]:
        """of(layer, modules) as lists: [len(modules)][num_pages]."""
        return [self._host[layer][self._index[m]] for m in modules]

    def set(self, key: tuple[int, str], slot: int, rank: int) -> None:
        """Record the rank of module key in slot (0: the adapter leaves it out). A load writes
        its reserved slot's ranks outside the slab's lock; which slots use an outer module
        changes only in `mark`, under it."""
        layer, module = key
        host = self._host[layer][self._index[module]]
        if host[slot] == rank:  # the table holds it already: no device write
            return
        self._table[layer][self._index[module], slot] = rank
        host[slot] = rank

    def mark(self, slot: int) -> None:
        """slot's ranks are published: it uses each outer module it has a rank on (hold the
        slab's lock, so that a step never sees one load's outer modules half-published)."""
        for module, slots in self._outer_slots.items():
            used = self._host[OUTER_LAYER][self._index[module]][slot]
            (slots.add if used else slots.discard)(slot)

    def clear(self, slot: int) -> None:
        """slot is empty: its ranks 0, no outer module used by it (hold the slab's lock)."""
        for slots in self._outer_slots.values():
            slots.discard(slot)
        for layer, table in self._table.items():
            table[:, slot] = 0
            for host in self._host[layer]:
                host[slot] = 0

    def serves_outer(self, module: str) -> bool:
        """Whether some slot's adapter has LoRA on module (embed_tokens or lm_head)."""
        return bool(self._outer_slots.get(module))
