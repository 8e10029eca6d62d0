"""Block manager invariants under random allocate / append / compute / deallocate sequences,
with every block kept and under a sliding window (blocks behind it released)."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from serving.engine.kv_cache import BlockManager
from serving.engine.kv_window import RELEASED
from serving.engine.sequence import Sequence
from tests.serving.engine.kv_helpers import make_seq


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / compute / deallocate, with a shadow KV store to check reads.

    The shadow store writes, for each computed position, what its KV depends on (the adapter
    and every token up to it); a reused or evicted block that served wrong KV shows up there.
    """

    WINDOW: int | None = None  # every layer's attention window; None: every block is kept

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=8, block_size=4, window=self.WINDOW)
        self.seqs: list[Sequence] = []
        self.kv: dict[tuple[int, int], tuple] = {}  # (block id, slot) -> what its KV encodes

    def _pick(self, data, live):
        return data.draw(st.sampled_from([s for s in self.seqs if bool(s.block_table) == live]))

    @precondition(lambda self: len(self.seqs) < 5)
    @rule(
        chunks=st.lists(st.sampled_from([(0, 0, 1, 1), (1, 0, 1, 0), (0, 0, 0, 0)]), max_size=4),
        tail=st.lists(st.integers(0, 1), max_size=3),
        key=st.sampled_from([None, "a", "b"]),
    )
    def add(self, chunks, tail, key):
        # Prompts built from three block-sized chunks share prefixes often, and the same
        # block of tokens shows up at different positions (a broken hash chain would hit).
        tokens = [t for chunk in chunks for t in chunk] + tail
        if tokens:
            self.seqs.append(make_seq(tokens, key))

    @precondition(lambda self: any(not s.block_table for s in self.seqs))
    @rule(data=st.data())
    def allocate(self, data):
        seq = self._pick(data, live=False)
        num_tokens = data.draw(st.integers(1, seq.num_tokens))
        if self.bm.can_allocate(seq, num_tokens):
            self.bm.allocate(seq, num_tokens)
            assert seq.num_cached_tokens < seq.num_tokens  # the last token always runs
        else:
            with pytest.raises(RuntimeError):
                self.bm.allocate(seq, num_tokens)

    @precondition(lambda self: any(s.block_table for s in self.seqs))
    @rule(data=st.data())
    def compute(self, data):
        seq = self._pick(data, live=True)
        if seq.num_cached_tokens == seq.num_tokens:  # decode: sample a token first
            seq.token_ids.append(data.draw(st.integers(0, 2)))
        n = data.draw(st.integers(1, seq.num_tokens - seq.num_cached_tokens))
        lookahead = data.draw(st.integers(0, 4))  # room for speculative tokens, maybe unused
        if not self.bm.can_append(seq, n + lookahead):
            return
        self.bm.append(seq, n + lookahead)
        for pos in range(seq.num_cached_tokens, seq.num_cached_tokens + n):
            block = seq.block_table[pos // 4]
            assert self.bm.ref_count(block) == 1  # the runner never writes a shared block
            self.kv[block, pos % 4] = (seq.adapter_key, tuple(seq.token_ids[: pos + 1]))
        self.bm.mark_computed(seq, n)

    @precondition(lambda self: any(s.block_table for s in self.seqs))
    @rule(data=st.data(), finished=st.booleans())
    def deallocate(self, data, finished):
        seq = self._pick(data, live=True)
        self.bm.deallocate(seq)  # finished, or preempted to be recomputed later
        num_free = self.bm.num_free_blocks
        self.bm.deallocate(seq)
        assert self.bm.num_free_blocks == num_free
        if finished:
            self.seqs.remove(seq)

    @invariant()
    def tables_and_counts_agree(self):
        live = [s for s in self.seqs if s.block_table]
        holders: dict[int, list[tuple[Sequence, int]]] = {}
        for seq in live:
            held = [b for b in seq.block_table if b != RELEASED]
            assert len(set(held)) == len(held)
            assert seq.num_cached_tokens <= len(seq.block_table) * 4
            # Released: a leading run, and never a block a query still to come reads.
            released = seq.num_released_blocks
            assert seq.block_table[:released] == [RELEASED] * released
            assert RELEASED not in seq.block_table[released:]
            lowest = 0 if self.WINDOW is None else seq.num_cached_tokens - self.WINDOW + 1
            assert released * 4 <= max(0, lowest)
            for i, block in enumerate(seq.block_table[released:], released):
                holders.setdefault(block, []).append((seq, i))
        for block in range(self.bm.num_blocks):
            assert self.bm.ref_count(block) == len(holders.get(block, []))
        assert self.bm.num_free_blocks + len(holders) == self.bm.num_blocks
        for users in holders.values():
            if len(users) > 1:  # shared: a full computed block, same hash at the same position
                assert len({i for _, i in users}) == 1
                i = users[0][1]
                assert all(s.num_cached_tokens >= (i + 1) * 4 for s, _ in users)
                assert len({self.bm.block_hashes(s)[i] for s, _ in users}) == 1

    @invariant()
    def cached_kv_is_what_each_sequence_would_compute(self):
        for seq in self.seqs:
            for pos in range(seq.num_released_blocks * 4, seq.num_cached_tokens):
                expected = (seq.adapter_key, tuple(seq.token_ids[: pos + 1]))
                assert self.kv[seq.block_table[pos // 4], pos % 4] == expected


BlockManagerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestBlockManagerMachine = BlockManagerMachine.TestCase


class WindowedMachine(BlockManagerMachine):
    """The same under a window of 3, shorter than a block: blocks go behind it at every
    step, and a block is registered with its parent released already."""

    WINDOW = 3


WindowedMachine.TestCase.settings = BlockManagerMachine.TestCase.settings
TestWindowedMachine = WindowedMachine.TestCase
