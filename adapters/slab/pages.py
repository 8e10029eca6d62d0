"""What one page of the adapter slab costs in device bytes, and how many pages a budget holds.

The slab (adapters/slab/slab.py) is `pages` pages of `page_rank` rows; a rank-r adapter holds
ceil(r / page_rank) contiguous pages. Per page, for every (layer, module) it serves:

    A rows   page_rank * in       B rows   page_rank * out        (the slab's dtype)
    bias     out                  dora     out                    (the slab's dtype)
    module rank                   int32

and per page its scale (float32), rank (int32), bias and DoRA flags (bool) and its
trainable-token slot (int32). Besides the pages the slab holds, once: the tail rows (the
last page's view reaches max_rank rows, max_rank - page_rank past it) and the trainable-token
pool (`token_slots` adapters' ids, rows and vocabulary map).

Config and deployment code size slabs with `page_costs`; the slab builds itself from it,
so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adapters.format.base_model import BaseModelSpec, expert_of

# Per page, beside the rows and vectors: scale f32, rank i32, has_bias and has_dora bool,
# the page's trainable-token slot i32 (adapters/slab/slots.py, adapters/slab/tokens.py).
_PAGE_TABLE_BYTES = 4 + 4 + 1 + 1 + 4
_MODULE_RANK_BYTES = 4  # int32 per page and (layer, module) (adapters/slab/ranks.py)


@dataclass(frozen=True)
class PageCosts:
    """The slab's device bytes: `page_bytes` per page, plus `fixed_bytes` whatever the pages."""

    page_rank: int
    max_rank: int
    page_bytes: int
    fixed_bytes: int

    def pages_of(self, rank: int) -> int:
        """The contiguous pages a rank-`rank` adapter holds (one at least: its slot)."""
        return max(1, -(-rank // self.page_rank))

    def pages_for(self, slab_bytes: int) -> int:
        """How many pages `slab_bytes` hold, fixed bytes included (0 if not even those)."""
        return max(0, (slab_bytes - self.fixed_bytes) // self.page_bytes)

    def bytes_for(self, pages: int) -> int:
        """The device bytes of a slab of `pages` pages."""
        return pages * self.page_bytes + self.fixed_bytes


def page_costs(
    spec: BaseModelSpec,
    *,
    max_rank: int,
    page_rank: int = 8,
    dtype: torch.dtype = torch.float32,
    modules: Sequence[str] | None = None,
    embeddings: bool = False,
    max_tokens: int = 64,
    token_slots: int = 16,
) -> PageCosts:
    """The costs of a slab built with these arguments (AdapterSlab's, of the same names).

    page_rank is clamped to max_rank, as the slab clamps it.
    """
    if max_rank < 1 or page_rank < 1:
        raise ValueError(f"max_rank and page_rank must be >= 1, got {max_rank}, {page_rank}")
    page_rank = min(page_rank, max_rank)
    size = torch.empty((), dtype=dtype).element_size()
    names = list(spec.shapes if modules is None else modules) * spec.num_layers
    names += list(spec.outer_shapes) if embeddings else []
    shapes = [spec.shapes.get(m) or spec.outer_shapes[m] for m in names]
    row = sum(fan_in + fan_out for fan_in, fan_out in shapes) * size  # one row of every stack
    # bias and dora, which experts have none of (adapters/slab/slots.py)
    vectors = sum(2 * o for m, (_, o) in zip(names, shapes) if expert_of(m) is None) * size
    per_page = page_rank * row + vectors + _MODULE_RANK_BYTES * len(shapes) + _PAGE_TABLE_BYTES
    tail = (max_rank - page_rank) * row  # the last page's view reaches max_rank rows
    pool = token_pool_bytes(spec, dtype=dtype, max_tokens=max_tokens, token_slots=token_slots)
    return PageCosts(page_rank, max_rank, per_page, tail + pool)


def token_pool_bytes(
    spec: BaseModelSpec, *, dtype: torch.dtype, max_tokens: int, token_slots: int
) -> int:
    """The trainable-token pool's bytes: per token slot, ids [max_tokens] int64, rows
    [max_tokens, hidden] and the map where [vocab] int32 (none without a vocabulary)."""
    if spec.vocab_size <= 0 or max_tokens <= 0:
        return 0
    size = torch.empty((), dtype=dtype).element_size()
    per_slot = max_tokens * 8 + max_tokens * spec.hidden_size * size + spec.vocab_size * 4
    return token_slots * per_slot


def count_pages(costs: PageCosts, *, num_slots: int | None, slab_bytes: int | None) -> int:
    """The pages of a slab sized by exactly one of num_slots (room for that many adapters
    of max_rank) or slab_bytes (as many pages as the bytes hold, fixed bytes included).

    ValueError when both or neither is given, or the bytes hold less than one max_rank
    adapter's pages.
    """
    if (num_slots is None) == (slab_bytes is None):
        raise ValueError("give the slab exactly one of num_slots and slab_bytes")
    per_adapter = costs.pages_of(costs.max_rank)
    if num_slots is not None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        return num_slots * per_adapter
    pages = costs.pages_for(slab_bytes)
    if pages < per_adapter:
        raise ValueError(
            f"slab_bytes {slab_bytes} hold {pages} pages of rank {costs.page_rank} "
            f"({costs.page_bytes} bytes each, beside {costs.fixed_bytes} fixed); one adapter "
            f"of max_rank {costs.max_rank} needs {per_adapter}: "
            f"{costs.bytes_for(per_adapter)} bytes at least"
        )
    return pages
