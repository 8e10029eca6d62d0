"""Sliding-window release: the KV blocks that no query of a sequence can read again leave it.

When every layer of the served models attends through a sliding window (Mistral, Qwen2/3 with
use_sliding_window on every layer, Phi-3; a draft model's layers too), a query at position p
reads keys p - W + 1 .. p only, W the widest window (serving.model.step_plan.window_reach).
A sequence's queries still to come start at its num_cached_tokens c, the tokens whose KV is
final: a prefill chunk's first query is there, a decode's or a verification's too, and the
rollback of rejected drafts never goes below it. So the blocks wholly below c - W + 1 are
never read again, and BlockManager releases them: their ref counts drop (a registered one
stays findable in the prefix cache, under other sequences' refs or in its LRU, as any freed
block), and their table entries become RELEASED, which no attention path reads
(kernels.paged_attention allows -1 exactly below a sequence's first query's window).

Example, block_size 4, W 6, c 14: queries from 14 on read keys from 9 on, so blocks 0 (keys
0-3) and 1 (4-7) are released: table [RELEASED, RELEASED, 3, 5], block 3 holding keys 8-11.

A model with one full-attention layer (Gemma 2 and 3 mix them) has no W: nothing is released.
A running windowed sequence holds about ceil(W / block_size) + 1 blocks plus its chunk's,
whatever its length; preemption frees what it still holds, and its recompute starts over
from a full table (prefix hits below its first chunk's window are named RELEASED at once).

A draft model's KV (speculative/draft.py) lives in the same blocks and lags the target's
until it proposes: its catch-up queries start at the sequence's num_draft_tokens, so with a
draft model the blocks below that one's window are kept too (draft_kv), and the draft's KV
stays exact. A sequence the draft never proposes for (speculation off) keeps its blocks, as
without a window, and a prompt chunk is not cut to the room there is (nothing is released
while a prompt runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.engine.sequence import Sequence

RELEASED = -1  # a block table entry whose block the sequence no longer holds


@dataclass(frozen=True)
class KVWindow:
    """The window every layer's attention stays within (None: some layer reads everything)."""

    window: int | None
    block_size: int
    draft_kv: bool = False  # a draft model keeps KV in the same blocks (speculative/draft.py)

    def behind(self, seq: Sequence, first_query: int) -> int:
        """Leading blocks of seq no query still to come reads: none at or past the target's
        first_query reads them, nor, with draft_kv, the draft's catch-up from its own
        num_draft_tokens (which lags until the draft proposes for seq)."""
        if self.draft_kv:
            first_query = min(first_query, seq.num_draft_tokens)
        return self.num_unread(first_query)

    def num_unread(self, first_query: int) -> int:
        """Leading blocks wholly below the window of a query at first_query, and so of every
        later one (0 without a window)."""
        if self.window is None:
            return 0
        return max(0, first_query - self.window + 1) // self.block_size

    def first_query_clear_of(self, num_released: int) -> int:
        """The lowest query position whose window reads none of num_released leading blocks."""
        if num_released == 0:  # (always so without a window)
            return 0
        return num_released * self.block_size + self.window - 1

    @property
    def cuts_chunks(self) -> bool:
        """Whether a prompt chunk is cut to the room there is: a shorter one makes progress
        when the blocks behind it are released as it goes (not while a draft's KV, which
        catches up only once the prompt is in, holds them)."""
        return self.window is not None and not self.draft_kv

    def chunk(self, num_tokens: int, room: int) -> int:
        """Of a chunk of num_tokens, how many to schedule when `room` tokens fit the blocks
        held and free now: as many as fit, at least a block's worth (the scheduler makes room
        for that, or waits); all of them unless cuts_chunks."""
        if not self.cuts_chunks:
            return num_tokens
        return min(num_tokens, max(room, self.block_size))
