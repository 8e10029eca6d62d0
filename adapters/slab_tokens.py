"""The slab's trainable tokens: per slot, up to max_tokens embedding rows of its own.

    ids[num_slots, max_tokens] int64     the token ids, -1 past the adapter's count
    rows[num_slots, max_tokens, hidden]  their embeddings
    where[num_slots, vocab] int32        token id -> its index in the slot's rows, -1: none

`where` makes a step's lookup one gather over its tokens, whatever each slot holds.
"""

from __future__ import annotations

import torch

from adapters.errors import AdapterError
from adapters.format import Adapter


class SlabTokens:
    """Every slot's trainable tokens (none for a slot whose adapter has none)."""

    def __init__(
        self, num_slots: int, vocab: int, hidden: int, max_tokens: int, *, dtype, device
    ) -> None:
        self.max_tokens = max_tokens if vocab > 0 else 0
        width = self.max_tokens
        self.ids = torch.full((num_slots, width), -1, dtype=torch.int64, device=device)
        self.rows = torch.zeros(num_slots, width, hidden, dtype=dtype, device=device)
        self.where = torch.full(
            (num_slots, vocab if width else 0), -1, dtype=torch.int32, device=device
        )
        self.has = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self._host_has = [False] * num_slots
        self.count = 0  # slots with tokens, read on the host per step

    def check(self, version: str, adapter: Adapter) -> None:
        """AdapterError if the adapter has more trainable tokens than a slot holds."""
        n = 0 if adapter.tokens is None else adapter.tokens.ids.numel()
        if n > self.max_tokens:
            raise AdapterError(
                f"adapter {version}: has {n} trainable tokens; this server holds at most "
                f"{self.max_tokens} per adapter (lora.max_trainable_tokens)"
            )

    def write(self, slot: int, adapter: Adapter | None) -> None:
        """Fill slot's rows from adapter's trainable tokens (None, or none: clear them).

        Only slot's own entries change, so a load may write them outside the slab's lock;
        whether the slot has tokens, and the count, change in `mark`.
        """
        if not self.max_tokens:
            return
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

    def mark(self, slot: int, adapter: Adapter | None) -> None:
        """Record whether slot's adapter (None: an empty slot) has trainable tokens.

        Call it holding the slab's lock: the count is every slot's, and two loads that each
        summed the flags on their own could leave it at 0 while a slot has tokens, when a
        step would skip that slot's rows.
        """
        wanted = bool(self.max_tokens) and adapter is not None and adapter.tokens is not None
        self.has[slot] = self._host_has[slot] = wanted
        self.count = sum(self._host_has)
