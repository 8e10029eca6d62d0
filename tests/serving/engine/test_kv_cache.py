"""Block manager: accounting, adapter-keyed prefix hits, LRU reuse (invariants under random
operations are in test_kv_cache_properties.py)."""

import pytest

from serving.engine import kv_cache
from serving.engine.kv_cache import BlockManager, hash_block
from tests.serving.engine.kv_helpers import decode, make_seq, prefill


def test_hash_is_stable_and_keyed_on_everything():
    # A literal: the same value in every process, whatever PYTHONHASHSEED says.
    assert hash_block(None, (1, 2, 3, 4), None) == 3867402840694813110
    variants = [(None, (1, 2, 3, 4), None), (None, (1, 2, 3, 4), "sha256:ab")]
    variants += [(None, (1, 2, 3, 4), ""), (0, (1, 2, 3, 4), None), (None, (1, 2, 3, 5), None)]
    assert len({hash_block(*v) for v in variants}) == 5


def test_allocate_append_deallocate_accounting():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(range(10))
    assert bm.can_allocate(seq, 10)
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    assert seq.num_cached_tokens == seq.num_prefix_hit_tokens == 0
    bm.mark_computed(seq, 10)
    assert bm.can_append(seq, 3) and not bm.can_append(seq, 39)
    decode(bm, seq, (10, 11, 12))  # tokens 11 and 12 fit block 2, token 13 needs block 3
    assert len(seq.block_table) == 4 and bm.num_free_blocks == 4
    assert len(set(seq.block_table)) == 4 and all(bm.ref_count(b) == 1 for b in seq.block_table)
    assert bm.stats.usage == 0.5
    bm.deallocate(seq)
    assert seq.block_table == [] and seq.num_cached_tokens == 0 and bm.num_free_blocks == 8
    bm.deallocate(seq)  # twice: a no-op
    assert bm.num_free_blocks == 8 and bm.stats.usage == 0.0


@pytest.mark.parametrize(
    ("prompt_len", "hit_tokens"), [(10, 8), (12, 8), (13, 12), (4, 0), (5, 4), (1, 0)]
)
def test_same_prompt_same_adapter_hits_all_but_the_last_token_block(prompt_len, hit_tokens):
    bm = BlockManager(num_blocks=16, block_size=4)
    first, second = make_seq(range(prompt_len), "d1"), make_seq(range(prompt_len), "d1")
    prefill(bm, first)
    assert bm.num_prefix_hit_tokens(second) == hit_tokens
    bm.allocate(second, prompt_len)
    assert second.num_prefix_hit_tokens == second.num_cached_tokens == hit_tokens
    shared = hit_tokens // 4
    assert second.block_table[:shared] == first.block_table[:shared]
    assert not set(second.block_table[shared:]) & set(first.block_table)
    assert all(bm.ref_count(b) == 2 for b in second.block_table[:shared])
    assert bm.stats.num_hit_tokens == hit_tokens
    assert bm.stats.num_queried_tokens == 2 * prompt_len


@pytest.mark.parametrize(("key_a", "key_b"), [("d1", "d2"), (None, "d1"), ("d1", None)])
def test_same_prompt_under_another_adapter_never_hits(key_a, key_b):
    bm = BlockManager(num_blocks=16, block_size=4)
    first, second = make_seq(range(20), key_a), make_seq(range(20), key_b)
    prefill(bm, first)
    bm.allocate(second, 20)
    assert second.num_prefix_hit_tokens == 0
    assert not set(second.block_table) & set(first.block_table)
    assert bm.block_hashes(first)[0] != bm.block_hashes(second)[0]


def test_a_sequence_extending_a_cached_one_hits_the_shared_blocks():
    bm = BlockManager(num_blocks=16, block_size=4)
    chat = make_seq(range(8), "d")
    prefill(bm, chat)
    decode(bm, chat, (100, 101, 102, 103, 104))  # generated tokens are cached too, once full
    follow_up = make_seq([*chat.token_ids[:12], 7, 7], "d")
    bm.allocate(follow_up, follow_up.num_tokens)
    assert follow_up.num_prefix_hit_tokens == 12
    assert follow_up.block_table[:3] == chat.block_table[:3]
    assert bm.block_hashes(follow_up)[:3] == bm.block_hashes(chat)[:3]


def test_freed_cached_blocks_are_reused_by_hash_and_evicted_lru():
    bm = BlockManager(num_blocks=6, block_size=4)
    a, x = make_seq(range(9)), make_seq(range(50, 59))
    prefill(bm, a)
    prefill(bm, x)
    a_blocks, x_blocks = list(a.block_table), list(x.block_table)
    bm.deallocate(a)  # a's two full blocks freed first: the oldest in the LRU
    bm.deallocate(x)
    assert bm.num_free_blocks == 6 and bm.stats.num_cached_blocks == 4
    other = make_seq(range(200, 212))  # 3 blocks: both uncached partial blocks, then a[1]
    bm.allocate(other, 12)
    assert set(other.block_table) == {a_blocks[2], x_blocks[2], a_blocks[1]}
    assert bm.stats.num_cached_blocks == 3
    assert bm.num_prefix_hit_tokens(make_seq(range(9))) == 4  # a[1] is gone: the walk stops
    x_again = make_seq(range(50, 59))
    bm.allocate(x_again, 9)  # both hits, plus one new block: a[0], now the oldest cached
    assert x_again.num_prefix_hit_tokens == 8 and x_again.block_table[:2] == x_blocks[:2]
    assert x_again.block_table[2] == a_blocks[0] and bm.num_free_blocks == 0
    assert bm.num_prefix_hit_tokens(make_seq(range(9))) == 0


def test_a_hit_on_a_free_cached_block_uses_up_the_pool_too():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = make_seq(range(9))
    prefill(bm, a)
    bm.deallocate(a)  # two cached full blocks and one plain free block
    bm.allocate(make_seq(range(100, 104)), 4)  # takes the plain one
    again = make_seq(range(9))
    assert bm.num_prefix_hit_tokens(again) == 8
    assert not bm.can_allocate(again, 9)  # 2 free hits + 1 new block > 2 free blocks


def test_live_sequences_sharing_blocks_count_references():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq(range(10)), make_seq(range(10))
    prefill(bm, a)
    prefill(bm, b)
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and bm.num_free_blocks == 8 - 4
    bm.deallocate(a)
    assert all(bm.ref_count(blk) == 1 for blk in shared) and b.block_table[:2] == shared
    assert bm.num_free_blocks == 8 - 3
    decode(bm, b, (10,))
    bm.deallocate(b)
    assert bm.num_free_blocks == 8 and all(bm.ref_count(i) == 0 for i in range(8))


def test_a_block_computed_twice_side_by_side_is_cached_once():
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = make_seq(range(5)), make_seq(range(5))
    bm.allocate(a, 5)
    bm.allocate(b, 5)  # before a computed anything: no hit, a private copy
    bm.mark_computed(a, 5)
    bm.mark_computed(b, 5)
    assert bm.stats.num_cached_blocks == 1 and b.block_table[0] != a.block_table[0]
    bm.deallocate(a)
    bm.deallocate(b)  # b's copy is not the cached one: freed like an uncached block
    bm.allocate(make_seq(range(100, 112)), 12)  # three uncached blocks are there to take
    assert bm.num_prefix_hit_tokens(make_seq(range(5))) == 4


def test_chunked_prefill_registers_blocks_as_they_fill():
    bm = BlockManager(num_blocks=16, block_size=4)
    seq = make_seq(range(20), "d")
    bm.allocate(seq, 6)
    assert len(seq.block_table) == 2
    bm.mark_computed(seq, 6)
    assert bm.stats.num_cached_blocks == 1  # block 1 is half computed: not yet reusable
    assert bm.can_append(seq, 8)
    bm.append(seq, 8)
    bm.mark_computed(seq, 8)
    assert len(seq.block_table) == 4 and bm.stats.num_cached_blocks == 3
    bm.append(seq, 6)
    bm.mark_computed(seq, 6)
    assert seq.num_cached_tokens == 20 and bm.stats.num_cached_blocks == 5
    # A first chunk smaller than the hits still takes every hit (they cost no compute).
    again = make_seq(range(20), "d")
    bm.allocate(again, 4)
    assert again.num_cached_tokens == 16 and again.block_table == seq.block_table[:4]
    bm.append(again, 4)
    assert len(again.block_table) == 5 and again.block_table[4] != seq.block_table[4]


def test_full_pool_refuses_with_a_clear_error():
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = make_seq(range(12)), make_seq(range(100, 104))
    prefill(bm, a)
    assert bm.num_free_blocks == 0 and not bm.can_allocate(b, 4)
    with pytest.raises(RuntimeError, match="KV cache full"):
        bm.allocate(b, 4)
    assert b.block_table == [] and bm.stats.num_queried_tokens == 12
    a.token_ids.append(12)
    assert not bm.can_append(a, 1)
    with pytest.raises(RuntimeError, match="KV cache full"):
        bm.append(a, 1)


def test_misuse_raises():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(range(6))
    with pytest.raises(ValueError, match="num_tokens"):
        bm.allocate(seq, 7)
    bm.allocate(seq, 4)
    with pytest.raises(RuntimeError, match="already holds"):
        bm.allocate(seq, 4)
    with pytest.raises(ValueError, match="cannot mark"):
        bm.mark_computed(seq, 5)  # only one block: 4 slots


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a, b = make_seq(range(12)), make_seq(range(12))
    prefill(bm, a)
    bm.deallocate(a)
    prefill(bm, b)
    assert b.num_prefix_hit_tokens == 0 and bm.stats.num_cached_blocks == 0
    assert bm.stats.num_hit_tokens == 0 and bm.stats.hit_rate == 0.0


def test_hash_collision_is_not_a_hit(monkeypatch):
    monkeypatch.setattr(kv_cache, "hash_block", lambda parent, tokens, key: 42)
    bm = BlockManager(num_blocks=8, block_size=4)
    prefill(bm, make_seq(range(9)))
    other = make_seq(range(100, 109))  # same (forced) hash, other tokens
    bm.allocate(other, 9)
    assert other.num_prefix_hit_tokens == 0
