"""KV block manager: the cache blocks each sequence owns, plus an adapter-aware prefix cache.

Pure bookkeeping over block ids; the KV tensors live with the model runner, addressed by the
ids in each `Sequence.block_table`. Modelled on nano-vllm's block manager and vLLM's automatic
prefix caching:

- the pool is `num_blocks` blocks of `block_size` token slots; each block has a ref count
  (how many block tables hold it) and is free at 0;
- a full block whose KV is computed is registered under (engine/block_hash.py)
  hash(parent block's hash, its token ids, the adapter's content digest), so a later sequence
  with the same leading tokens under the same adapter version reuses it. Keying on the digest,
  never the name, means two adapters, or a re-uploaded one, never share KV;
- a freed registered block stays findable until the pool needs it: new blocks come from free
  blocks that hold nothing cached first, then from the least recently freed cached block.

Example, block_size 4, prompt 1..10 under adapter digest "d":
    blocks  [1 2 3 4] [5 6 7 8] [9 10 _ _]
    hashes  h0 = H(None, (1,2,3,4), "d"),  h1 = H(h0, (5,6,7,8), "d"),  partial block: none
A second prompt 1..9, 42 under "d" reuses both full blocks (8 tokens) and computes from token 9;
the same prompt under another digest, or the base model (None), hits nothing.

Simplified: whole blocks only (no partial-block sharing, so no copy-on-write: a shared block is
full and never written again). Only tokens passed to `mark_computed` are ever registered, so
speculative positions that get rejected never enter the cache.

Under a sliding window (`window`: every layer of the served models has one, W the widest),
a block wholly below W of the earliest query a sequence can still issue is released as soon
as `mark_computed` (or `allocate`, for prefix hits) leaves it behind: freed like a
deallocated block, registered ones findable still, and its entry named RELEASED
(engine/kv_window.py; with a draft model, once the draft's KV is past it too). A running
windowed sequence then holds its window's blocks, not its length's.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from serving.engine.block_hash import BlockKey, hash_block
from serving.engine.kv_window import RELEASED, KVWindow
from serving.engine.sequence import Sequence


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once full and computed (with prefix caching on)
    key: BlockKey | None = None  # what `hash` stands for, compared on lookup against collisions


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the pool and of prefix-cache hits, for metrics."""

    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int  # registered in the prefix cache, in use or free
    num_queried_tokens: int  # tokens of every sequence allocated so far
    num_hit_tokens: int  # of those, how many came from the prefix cache

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hit tokens over queried tokens (0 before any query)."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class BlockManager:
    """Owns the KV block pool: block tables, ref counts, the prefix cache and its LRU."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 window: int | None = None, draft_kv: bool = False):  # fmt: skip
        """window: every layer's attention window is at most this (None: some layer reads the
        whole context); the blocks behind it are released (engine/kv_window.py), and with
        draft_kv only once a draft model's KV is past them too."""
        if num_blocks < 1 or block_size < 1 or (window is not None and window < 1):
            raise ValueError(f"num_blocks, block_size and window must be >= 1, got "
                             f"{num_blocks}, {block_size}, {window}")  # fmt: skip
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = KVWindow(window, block_size, draft_kv)
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))  # free and holding nothing cached
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # free, findable; oldest first
        self._hash_to_block: dict[int, int] = {}
        self._num_queried_tokens = 0
        self._num_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached ones included (they are reclaimed on demand)."""
        return len(self._free) + len(self._free_cached)

    @property
    def stats(self) -> CacheStats:
        """Counters and usage as of now."""
        return CacheStats(
            num_blocks=self.num_blocks,
            num_free_blocks=self.num_free_blocks,
            num_cached_blocks=len(self._hash_to_block),
            num_queried_tokens=self._num_queried_tokens,
            num_hit_tokens=self._num_hit_tokens,
        )

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold this block."""
        return self._blocks[block_id].ref_count

    def block_hashes(self, seq: Sequence) -> list[int]:
        """Prefix-cache hashes of seq's full blocks, from its tokens and adapter key."""
        hashes: list[int] = []
        parent = None
        for i in range(seq.num_tokens // self.block_size):
            parent = hash_block(parent, self._block_tokens(seq, i), seq.adapter_key)
            hashes.append(parent)
        return hashes

    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        """Tokens `allocate` would take from the prefix cache now (a lookup; changes nothing)."""
        return len(self._match_prefix(seq)) * self.block_size

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether `allocate(seq, num_tokens)` would find enough free blocks."""
        return self._allocation(seq, num_tokens)[2] <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Give a sequence without blocks its prefix hits plus blocks for its first num_tokens.

        The table always takes every hit, even past num_tokens (hits cost no compute), so
        afterwards seq.num_cached_tokens may exceed num_tokens.
        """
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds KV blocks; use append")
        if not 0 < num_tokens <= seq.num_tokens:
            raise ValueError(f"num_tokens must be in 1..{seq.num_tokens}, got {num_tokens}")
        hits, num_new, num_needed = self._allocation(seq, num_tokens)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(
                f"KV cache full: sequence {seq.seq_id} needs {num_needed} free blocks, "
                f"{self.num_free_blocks} are free (check can_allocate first)"
            )
        # Hits wholly below the first query's window are never read: RELEASED, no ref taken.
        skip = self.window.behind(seq, len(hits) * self.block_size)
        for block_id in hits[skip:]:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free_cached[block_id]
            block.ref_count += 1
        seq.block_table.extend([RELEASED] * skip + hits[skip:])
        seq.block_table.extend(self._pop_free() for _ in range(num_new))
        if skip:
            seq.num_released_blocks, seq.released_hash = skip, self._blocks[hits[skip - 1]].hash
        seq.num_cached_tokens = seq.num_prefix_hit_tokens = len(hits) * self.block_size
        self._num_queried_tokens += seq.num_tokens
        self._num_hit_tokens += seq.num_prefix_hit_tokens

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether `append(seq, num_new_tokens)` would find enough free blocks."""
        return self._num_missing(seq, num_new_tokens) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Ensure blocks for positions up to seq.num_cached_tokens + num_new_tokens."""
        num_missing = self._num_missing(seq, num_new_tokens)
        if num_missing > self.num_free_blocks:
            raise RuntimeError(
                f"KV cache full: sequence {seq.seq_id} needs {num_missing} more blocks, "
                f"{self.num_free_blocks} are free (check can_append first)"
            )
        seq.block_table.extend(self._pop_free() for _ in range(num_missing))

    def chunk_that_fits(self, seq: Sequence, num_new_tokens: int) -> int:
        """How many of num_new_tokens more for seq (after its prefix hits, if it holds no
        blocks yet) to schedule now: all without a window; under one, what its blocks' empty
        slots and the free blocks hold, at least a block's worth (KVWindow.chunk)."""
        if not self.window.cuts_chunks:
            return num_new_tokens
        bs, free = self.block_size, self.num_free_blocks
        if seq.block_table:
            room = (len(seq.block_table) + free) * bs - seq.num_cached_tokens
        else:  # a hit on a free cached block takes one of the free blocks too
            taken = self._allocation(seq, 0)[2]
            room = (free - taken) * bs
        return self.window.chunk(num_new_tokens, room)

    def mark_computed(self, seq: Sequence, num_computed: int) -> None:
        """Record KV for num_computed more tokens; register the blocks that became full, and
        release those that fell wholly behind every window."""
        bs = self.block_size
        start, end = seq.num_cached_tokens, seq.num_cached_tokens + num_computed
        limit = min(seq.num_tokens, len(seq.block_table) * bs)
        if num_computed < 0 or end > limit:
            raise ValueError(
                f"sequence {seq.seq_id}: cannot mark {num_computed} tokens computed after "
                f"{start}; its tokens and blocks reach {limit}"
            )
        seq.num_cached_tokens = end
        if self.enable_prefix_caching:
            self._register(seq, range(start // bs, end // bs))
        # The queries to come start at `end`: the blocks below their windows go (after being
        # registered, so a released block stays findable).
        behind = self.window.behind(seq, end)
        for i in range(seq.num_released_blocks, behind):
            seq.released_hash = self._blocks[seq.block_table[i]].hash
            self._release(seq.block_table[i])
            seq.block_table[i] = RELEASED
        seq.num_released_blocks = max(seq.num_released_blocks, behind)

    def deallocate(self, seq: Sequence) -> None:
        """Release seq's blocks and reset it to uncomputed (also preemption by recompute)."""
        # Tail first: the LRU then evicts a freed sequence's last blocks before its first,
        # which more prompts share. RELEASED entries were released already.
        for block_id in reversed(seq.block_table):
            if block_id != RELEASED:
                self._release(block_id)
        seq.block_table.clear()
        seq.num_cached_tokens = seq.num_released_blocks = seq.num_draft_tokens = 0
        seq.released_hash = None

    def _release(self, block_id: int) -> None:
        """Drop one table's ref; at 0 the block is free (findable still, if registered)."""
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.hash is not None and self._hash_to_block.get(block.hash) == block_id:
            self._free_cached[block_id] = None
        else:
            block.hash = block.key = None
            self._free.append(block_id)

    def _register(self, seq: Sequence, full: range) -> None:
        """Register seq's blocks at table indices `full`, whose last slots were just computed."""
        for i in full:
            block, parent = self._blocks[seq.block_table[i]], None
            if i:  # every earlier block is full and computed, so it carries its hash already
                before = seq.block_table[i - 1]  # or was released last, its hash kept
                parent = seq.released_hash if before == RELEASED else self._blocks[before].hash
            tokens = self._block_tokens(seq, i)
            block.hash = hash_block(parent, tokens, seq.adapter_key)
            block.key = (parent, tokens, seq.adapter_key)
            # Two sequences computed the same block side by side: the first stays the cached
            # copy; this one keeps its hash (for chaining) and is dropped when freed.
            self._hash_to_block.setdefault(block.hash, block.block_id)

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of seq's leading cached blocks, up to the first miss."""
        # A hit's positions would get no logits: a sequence that wants its prompt's computes
        # them all (as vLLM does), and still registers its blocks for others.
        if not self.enable_prefix_caching or seq.wants_prompt_logits:
            return []
        hits: list[int] = []
        parent = None
        # Never the block holding the last token: one token must run to give logits.
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = self._block_tokens(seq, i)
            h = hash_block(parent, tokens, seq.adapter_key)
            block_id = self._hash_to_block.get(h)
            if block_id is None or self._blocks[block_id].key != (parent, tokens, seq.adapter_key):
                break
            hits.append(block_id)
            parent = h
        return hits

    def _allocation(self, seq: Sequence, num_tokens: int) -> tuple[list[int], int, int]:
        """(prefix hits, new blocks to pop, free blocks consumed) for allocate."""
        hits = self._match_prefix(seq)
        num_new = max(0, -(-num_tokens // self.block_size) - len(hits))
        # A hit on a free cached block takes it out of the free pool too (unless released).
        skip = self.window.behind(seq, len(hits) * self.block_size)
        num_free_hits = sum(1 for b in hits[skip:] if self._blocks[b].ref_count == 0)
        return hits, num_new, num_new + num_free_hits

    def _num_missing(self, seq: Sequence, num_new_tokens: int) -> int:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        num_needed = -(-(seq.num_cached_tokens + num_new_tokens) // self.block_size)
        return max(0, num_needed - len(seq.block_table))

    def _pop_free(self) -> int:
        """Take a free block for new KV: one holding nothing cached, else the LRU cached one."""
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            block = self._blocks[block_id]
            del self._hash_to_block[block.hash]
            block.hash = block.key = None
        self._blocks[block_id].ref_count = 1
        return block_id
