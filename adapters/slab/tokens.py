"""The slab's trainable tokens: a small pool of token slots, each an adapter's own rows.

A map [vocab] per page would cost more than the page, so trainable tokens are not per
page: the slab holds `num_slots` token slots (a few adapters at a time have any), and each
page names the token slot of the adapter whose slot it is:

    page_slots[num_pages] int32           page -> its adapter's token slot, -1: none
    ids[num_slots, max_tokens] int64      the token ids, -1 past the adapter's count
    rows[num_slots, max_tokens, hidden]   their embeddings
    where[num_slots, vocab] int32         token id -> its index in the slot's rows, -1: none

A step's lookup is then two gathers over its tokens, whatever each adapter holds
(serving/model/adapter_embeddings.py). Which adapter holds which token slot, and whom a load evicts to
get one, is the slab's (adapters/slab/slab.py, adapters/slab/alloc.py).
"""

from __future__ import annotations

import torch

from adapters.errors import AdapterError
from adapters.format.adapter import Adapter


class SlabTokens:
    """Every token slot's trainable tokens, and each page's token slot (-1: none)."""

    def __init__(
        self,
        num_pages: int,
        vocab: int,
        hidden: int,
        max_tokens: int,
        *,
        num_slots: int = 16,
        dtype,
        device,
    ) -> None:
        if num_slots < 0:
            raise ValueError(f"token slots must be >= 0, got {num_slots}")
        self.max_tokens = max_tokens if vocab > 0 and num_slots > 0 else 0
        width = self.max_tokens
        self.num_slots = num_slots if width else 0
        self.ids = torch.full((self.num_slots, width), -1, dtype=torch.int64, device=device)
        self.rows = torch.zeros(self.num_slots, width, hidden, dtype=dtype, device=device)
        self.where = torch.full((self.num_slots, vocab if width else 0), -1, dtype=torch.int32,
                                device=device)  # fmt: skip
        self.page_slots = torch.full((num_pages,), -1, dtype=torch.int32, device=device)
        self._host_page_slots = [-1] * num_pages
        self.count = 0  # pages (adapters) with tokens, read on the host per step

    def wants(self, adapter: Adapter) -> bool:
        """Whether adapter needs a token slot (it has trainable tokens, and they are served)."""
        return bool(self.max_tokens) and adapter.tokens is not None

    def check(self, version: str, adapter: Adapter) -> None:
        """AdapterError if the adapter has more trainable tokens than a token slot holds."""
        n = 0 if adapter.tokens is None else adapter.tokens.ids.numel()
        if n > self.max_tokens:
            raise AdapterError(
                f"adapter {version}: has {n} trainable tokens; this server holds at most "
                f"{self.max_tokens} per adapter (lora.max_trainable_tokens)"
            )

    def write(self, slot: int, adapter: Adapter | None) -> None:
        """Fill token slot `slot` from adapter's trainable tokens (None, or none: clear it).

        Only that token slot's entries change, and no page names it until `mark`, so a load
        may write them outside the slab's lock.
        """
        old = self.ids[slot][self.ids[slot] >= 0]
        self.where[slot, old] = -1
        self.ids[slot].fill_(-1)
        tokens = adapter.tokens if adapter is not None else None
        if tokens is not None:
            n = tokens.ids.numel()
            ids = tokens.ids.to(self.ids.device)
            self.ids[slot, :n] = ids
            self.rows[slot, :n] = tokens.rows.to(self.rows.device, self.rows.dtype)
            self.where[slot, ids] = torch.arange(n, dtype=torch.int32, device=ids.device)

    def mark(self, page: int, slot: int | None) -> None:
        """Point `page` (an adapter's slot) at token slot `slot` (None: the adapter has none).

        Call it holding the slab's lock: the count is every page's, and two loads that each
        summed the map on their own could leave it at 0 while an adapter has tokens, when a
        step would skip that adapter's rows.
        """
        value = -1 if slot is None else slot
        old = self._host_page_slots[page]
        if old == value:  # nothing changes: no device write
            return
        self.page_slots[page] = self._host_page_slots[page] = value
        self.count += (value >= 0) - (old >= 0)

    def slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        """[n] int64: the token slot of each page's adapter, -1 where it has none or the page
        is -1 (base only)."""
        index = pages.clamp(min=0).to(torch.int64)
        slots = self.page_slots.index_select(0, index).to(torch.int64)
        return torch.where(pages >= 0, slots, -1)
