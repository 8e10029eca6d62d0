"""Block manager under a sliding window: the blocks behind every query's window are released
(their entries RELEASED), so a long sequence holds its window's blocks; released blocks go
back to the pool, registered ones stay findable, and deallocation frees each block once.
(The engine doing it, token for token against transformers, is test_engine_window.py.)"""

import pytest

from serving.engine.kv_cache import BlockManager
from serving.engine.kv_window import RELEASED, KVWindow
from tests.serving.engine.kv_helpers import decode, make_seq, prefill


def held(seq) -> list[int]:
    return [b for b in seq.block_table if b != RELEASED]


def test_the_window_arithmetic():
    w = KVWindow(window=6, block_size=4)
    # queries from 14 on read keys from 9 on: blocks 0 (0-3) and 1 (4-7) are behind
    assert [w.num_unread(c) for c in (0, 5, 8, 9, 12, 13, 14)] == [0, 0, 0, 1, 1, 2, 2]
    assert w.first_query_clear_of(2) == 13  # 13 reads keys 8..13: none of blocks 0 and 1
    assert w.first_query_clear_of(0) == 0  # nothing released: any query
    assert w.chunk(100, room=12) == 12 and w.chunk(100, room=0) == 4 and w.chunk(3, 12) == 3
    nothing = KVWindow(window=None, block_size=4)
    assert nothing.num_unread(1000) == 0 and nothing.chunk(100, room=0) == 100
    drafted = KVWindow(window=6, block_size=4, draft_kv=True)
    seq = make_seq(range(20))
    seq.num_draft_tokens = 9  # the draft's catch-up reads keys from 4 on
    assert drafted.behind(seq, 14) == 1 and w.behind(seq, 14) == 2
    assert drafted.chunk(100, room=0) == 100  # nothing is released while a prompt runs


@pytest.mark.parametrize("window", [1, 3, 8, 13])
def test_a_long_decode_holds_a_bounded_number_of_blocks(window):
    bm = BlockManager(num_blocks=6, block_size=4, window=window)  # 24 slots
    seq = make_seq(range(10))
    prefill(bm, seq)
    bound = -(-window // 4) + 1  # the window's blocks, one of them partly behind it
    for token in range(100, 200):  # 110 tokens: 28 blocks' worth, in a pool of 6
        decode(bm, seq, (token,))
        assert len(held(seq)) <= bound + 1  # + the block the next token goes to
        assert bm.num_free_blocks == 6 - len(held(seq))
        assert len(seq.block_table) == -(-seq.num_tokens // 4)  # a full table, RELEASED below
        lowest = seq.num_cached_tokens - window + 1  # the next query's first key
        assert seq.block_table[: max(0, lowest) // 4] == [RELEASED] * (max(0, lowest) // 4)
        assert RELEASED not in seq.block_table[max(0, lowest) // 4 :]
    bm.deallocate(seq)  # preemption or finish: what is held is freed, once
    assert bm.num_free_blocks == 6 and all(bm.ref_count(b) == 0 for b in range(6))
    assert seq.block_table == [] and seq.num_released_blocks == 0


def test_without_a_window_the_same_decode_runs_out_of_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    seq = make_seq(range(10))
    prefill(bm, seq)
    with pytest.raises(RuntimeError, match="KV cache full"):
        decode(bm, seq, range(100, 200))


def test_released_blocks_return_to_the_pool_and_serve_another_sequence():
    bm = BlockManager(num_blocks=8, block_size=4, window=4, enable_prefix_caching=False)
    a = make_seq(range(20))
    prefill(bm, a)  # queries from 20 on read keys from 17 on: blocks 0-3 are behind
    assert a.block_table[:4] == [RELEASED] * 4 and len(held(a)) == 1
    assert bm.num_free_blocks == 7
    b = make_seq(range(100, 128))  # 7 blocks: every free one, the released four among them
    bm.allocate(b, 28)
    assert bm.num_free_blocks == 0 and not set(held(a)) & set(b.block_table)
    assert all(bm.ref_count(x) == 1 for x in b.block_table + held(a))


def test_a_released_registered_block_stays_findable():
    bm = BlockManager(num_blocks=16, block_size=4, window=8)
    a = make_seq(range(16), "d")
    bm.allocate(a, 16)
    first = list(a.block_table)
    bm.mark_computed(a, 16)
    decode(bm, a, range(100, 110))  # 26 tokens: queries from 26 read keys from 19 on
    assert a.block_table[:4] == [RELEASED] * 4
    assert all(bm.ref_count(b) == 0 for b in first)  # free, and still cached
    again = make_seq(range(16), "d")  # the same prompt: every block but the last token's
    assert bm.num_prefix_hit_tokens(again) == 12
    bm.allocate(again, 16)
    # Its first query (12) reads keys from 5 on: block 0 is behind it, RELEASED at once and
    # taken from no one; blocks 1 and 2 are a's, back in use.
    assert again.block_table[:3] == [RELEASED, *first[1:3]]
    assert [bm.ref_count(b) for b in first] == [0, 1, 1, 0]
    bm.mark_computed(again, 4)
    # ... and a sequence that extends a's generation finds the blocks a registered later,
    # chained on the hashes of the blocks a released before them.
    follow = make_seq([*a.token_ids[:24], 7])
    follow.adapter_key = "d"
    assert bm.num_prefix_hit_tokens(follow) == 24


def test_a_block_registered_after_its_parent_was_released_chains_on_its_hash():
    """Window 2 < block_size: block 1 fills while block 0 is already released."""
    bm = BlockManager(num_blocks=4, block_size=4, window=2)
    a = make_seq(range(6), "d")
    prefill(bm, a)  # next query at 6 reads 5, 6: block 0 released
    assert a.block_table[0] == RELEASED
    decode(bm, a, (6, 7, 8))  # block 1 (4-7) fills now, its parent released
    b = make_seq([*range(6), 6, 7, 8, 9], "d")
    assert bm.num_prefix_hit_tokens(b) == 8  # blocks 0 and 1, hashed as one chain


def test_a_draft_models_lagging_kv_keeps_the_blocks_it_reads():
    """With a draft model (draft_kv), release waits for the draft's KV: its catch-up reads
    keys from num_draft_tokens - W + 1 on, and stays exact."""
    bm = BlockManager(num_blocks=16, block_size=4, window=4, draft_kv=True)
    seq = make_seq(range(20))
    prefill(bm, seq)
    assert RELEASED not in seq.block_table  # the draft has no KV yet: it reads from 0
    seq.num_draft_tokens = 20  # it proposed: caught up to the last token
    decode(bm, seq, (20,))
    assert seq.block_table[:4] == [RELEASED] * 4  # its queries from 20 read keys from 17 on
    bm.deallocate(seq)
    assert seq.num_draft_tokens == 0 and bm.num_free_blocks == 16


def test_admission_does_not_count_hits_behind_the_window():
    bm = BlockManager(num_blocks=8, block_size=4, window=4)
    filler = make_seq(range(200, 212))
    bm.allocate(filler, 12)  # 3 blocks, held throughout
    a = make_seq(range(20), "d")
    prefill(bm, a)
    bm.deallocate(a)  # its five registered blocks: free and findable, the only free ones
    again = make_seq([*range(20), 42])  # hits all five; its first query (20) reads 17 on
    again.adapter_key = "d"
    assert bm.num_free_blocks == 5 and bm.num_prefix_hit_tokens(again) == 20
    # 4 hits are behind its window and taken from no one: 1 free hit + 1 new block, not 6
    assert bm.can_allocate(again, 21)
    bm.allocate(again, 21)
    assert again.block_table[:4] == [RELEASED] * 4 and again.num_cached_tokens == 20
    assert bm.num_free_blocks == 3 and len(held(again)) == 2


def test_a_chunk_is_cut_to_what_the_free_blocks_hold_under_a_window_only():
    windowed = BlockManager(num_blocks=6, block_size=4, window=4)
    plain = BlockManager(num_blocks=6, block_size=4)
    for bm in (windowed, plain):
        bm.allocate(make_seq(range(100, 108)), 8)  # 2 blocks held: 4 free
    long = make_seq(range(50))
    assert windowed.chunk_that_fits(long, 50) == 16 and plain.chunk_that_fits(long, 50) == 50
    windowed.allocate(long, 16)
    windowed.mark_computed(long, 16)  # its next query (16) reads 13 on: blocks 0-2 behind
    assert len(held(long)) == 1 and windowed.num_free_blocks == 3
    assert windowed.chunk_that_fits(long, 34) == 12  # its block's 0 slots + 3 free blocks
    windowed.allocate(make_seq(range(300, 312)), 12)  # none free: still a block's worth,
    assert windowed.chunk_that_fits(long, 34) == 4  # to preempt for, or to wait for
