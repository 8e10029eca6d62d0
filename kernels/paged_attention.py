"""Attention over a paged KV cache, and the write that fills it: Triton on CUDA, torch elsewhere.

The cache is a pool of fixed-size blocks, [num_blocks, block_size, num_kv_heads, head_dim]
for K and for V (the PagedAttention layout: Kwon et al., 2023, arXiv:2309.06180).
A sequence owns the blocks named in its row of block_tables, in order, so its
token at position p lives in slot  block_tables[s, p // block_size] * block_size + p % block_size.

Example, block_size 4: seq 0 has 3 cached tokens and 3 new ones, seq 1 decodes its 10th token.

    context_lens [6, 10]    query_start_loc [0, 3, 4]    block_tables [[7, 2, -1], [0, 5, 3]]
    seq 0: queries at positions 3, 4, 5 see positions 0..3, 0..4, 0..5
           (0-3 in block 7, 4-5 in block 2; slots 2-3 of block 2 and entry -1 are never read)
    seq 1: its query at position 9 sees blocks 0 and 5 and the first slot of block 3

Prefill (n_s == context_len), prefill on top of cached prefix blocks, chunked
prefill and decode (n_s == 1) all mix in one batch. The checks read the small
index tensors on the host, so on CUDA they cost a device sync per call.
"""

from __future__ import annotations

import math
from functools import partial
from itertools import pairwise
from numbers import Real

import torch
import torch.nn.functional as F

from kernels.lora_checks import ACTIVATION_DTYPES, check_shape, check_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K and V in its cache slot.

    Semantics:  k_cache.view(-1, Hkv, D)[slot_mapping[t]] = k[t]   (same for v); slot -1 = skip

    k, v: [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache: contiguous
    [num_blocks, block_size, num_kv_heads, head_dim], k's dtype; slot_mapping:
    [num_tokens] int, slot = block_id * block_size + offset, -1 for padding tokens.
    Plain torch indexing on every device.
    """
    check_tensor("k", k, dim=3, dtypes=ACTIVATION_DTYPES)
    check_tensor("v", v, dim=3, dtypes=(k.dtype,), device=k.device)
    check_shape("v", v, tuple(k.shape))
    _check_caches(k_cache, v_cache, dtype=k.dtype, device=k.device)
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if tuple(k.shape[1:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"k: expected [num_tokens, {num_kv_heads}, {head_dim}] (the cache's kv heads and "
            f"head_dim), got {tuple(k.shape)}"
        )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not cache.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    check_tensor("slot_mapping", slot_mapping, dim=1, dtypes=INDEX_DTYPES, device=k.device)
    check_shape("slot_mapping", slot_mapping, (k.shape[0],))
    num_slots = num_blocks * block_size
    if k.shape[0] and bool(((slot_mapping < -1) | (slot_mapping >= num_slots)).any()):
        raise ValueError(f"slot_mapping: expected slots in [-1, {num_slots}) (-1 = skip)")
    live = slot_mapping >= 0
    slots = slot_mapping[live].long()
    k_cache.view(num_slots, num_kv_heads, head_dim).index_copy_(0, slots, k[live])
    v_cache.view(num_slots, num_kv_heads, head_dim).index_copy_(0, slots, v[live])


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole context in the paged cache.

    Semantics:  query i of seq s sits at position p = context_lens[s] - n_s + i and
                out = softmax(q k^T * scale) v over cache positions 0..p of seq s,
                head h reading kv head h // (num_heads // num_kv_heads)       (GQA)

    q: [num_tokens, num_heads, head_dim], the new tokens of all sequences
    concatenated; k_cache, v_cache: [num_blocks, block_size, num_kv_heads,
    head_dim], q's dtype, holding the new tokens already (write_kv first);
    block_tables: [num_seqs, max_blocks_per_seq] int (entries past a context
    are never read); context_lens: [num_seqs] int, cached tokens including the
    new ones; query_start_loc: [num_seqs + 1] int, seq s's queries are
    q[query_start_loc[s]:query_start_loc[s + 1]]. Returns a new tensor shaped
    and typed like q.
    """
    check_tensor("q", q, dim=3, dtypes=ACTIVATION_DTYPES)
    _check_caches(k_cache, v_cache, dtype=q.dtype, device=q.device)
    num_tokens, num_heads, head_dim = q.shape
    _, _, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"k_cache: expected head_dim {head_dim} (from q), got {cache_head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"q: expected num_heads to be a multiple of num_kv_heads {num_kv_heads}, got {num_heads}"
        )
    if not isinstance(scale, Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale!r}")
    starts, lens = _check_batch(k_cache, block_tables, context_lens, query_start_loc, num_tokens)
    if q.is_cuda:
        from kernels.paged_attention_triton import paged_attention_triton

        max_query_len = max((b - a for a, b in pairwise(starts)), default=0)
        return paged_attention_triton(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            query_start_loc,
            float(scale),
            max_query_len=max_query_len,
        )
    return _paged_attention_torch(q, k_cache, v_cache, block_tables, starts, lens, float(scale))


def _check_caches(k_cache, v_cache, *, dtype, device) -> None:
    check_tensor("k_cache", k_cache, dim=4, dtypes=(dtype,), device=device)
    check_tensor("v_cache", v_cache, dim=4, dtypes=(dtype,), device=device)
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if k_cache.shape[1] == 0:
        raise ValueError("k_cache: expected a block_size (dimension 1) of at least 1, got 0")


def _check_batch(k_cache, block_tables, context_lens, query_start_loc, num_tokens):
    """The host copies of query_start_loc and context_lens, once they describe a valid batch."""
    device = k_cache.device
    num_blocks, block_size = k_cache.shape[:2]
    check_tensor("block_tables", block_tables, dim=2, dtypes=INDEX_DTYPES, device=device)
    num_seqs, max_blocks = block_tables.shape
    check_tensor("context_lens", context_lens, dim=1, dtypes=INDEX_DTYPES, device=device)
    check_shape("context_lens", context_lens, (num_seqs,))
    check_tensor("query_start_loc", query_start_loc, dim=1, dtypes=INDEX_DTYPES, device=device)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    starts, lens = query_start_loc.tolist(), context_lens.tolist()
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(
            f"query_start_loc: expected to run from 0 to num_tokens {num_tokens}, "
            f"got {starts[0]}..{starts[-1]}"
        )
    for s in range(num_seqs):
        n = starts[s + 1] - starts[s]
        if n < 0:
            raise ValueError(
                f"query_start_loc: decreases at seq {s} ({starts[s]} -> {starts[s + 1]})"
            )
        if lens[s] < n:
            raise ValueError(
                f"context_lens: seq {s} has {n} new tokens but a context of {lens[s]} "
                "(the context includes the new tokens)"
            )
        if -(-lens[s] // block_size) > max_blocks:
            raise ValueError(
                f"block_tables: seq {s} needs {-(-lens[s] // block_size)} blocks for "
                f"{lens[s]} tokens, but a row holds {max_blocks}"
            )
    # Only the entries a context covers must name real blocks; the rest may be anything.
    needed = torch.tensor([-(-c // block_size) for c in lens], device=device)
    used = torch.arange(max_blocks, device=device)[None, :] < needed[:, None]
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    if num_seqs and bool(bad.any()):
        s = int(bad.any(dim=1).nonzero()[0])
        raise ValueError(
            f"block_tables: seq {s} names a block outside [0, {num_blocks}) within its context"
        )
    return starts, lens


SHORT_QUERY = 17  # queries per sequence up to which the batched path runs (k + 1 for k <= 16)


def _paged_attention_torch(q, k_cache, v_cache, block_tables, starts, lens, scale):
    """The torch path: short queries in one batched SDPA call, every longer query on its own.

    GQA goes to SDPA (enable_gqa) rather than through copies of K/V per query head: a batch of
    decodes is bound by reading K/V, and the copies made it ~20x slower.
    """
    # float32 compute: fp16/bf16 softmax sums over thousands of keys drift, and the CPU is no
    # faster in half precision anyway.
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    attend = partial(F.scaled_dot_product_attention, scale=scale, enable_gqa=True)
    # Decodes and speculative verifications (a few queries each) go in one padded, batched
    # SDPA call; only longer queries (prefill chunks) run one sequence at a time.
    short = [s for s in range(len(lens)) if 1 <= starts[s + 1] - starts[s] <= SHORT_QUERY]
    if short:
        n = torch.tensor([starts[s + 1] - starts[s] for s in short], device=q.device)  # [S]
        ctx = torch.tensor([lens[s] for s in short], device=q.device)  # [S]
        width = int(n.max())
        num_blocks = -(-max(lens[s] for s in short) // block_size)
        # Entries past a context may be -1 or stale: clamp for the gather, zero after it.
        table = block_tables[short, :num_blocks].long().clamp(0, k_cache.shape[0] - 1)
        keys = torch.arange(num_blocks * block_size, device=q.device)  # [L]
        live = keys[None, :] < ctx[:, None]  # [S, L]
        k = _gather_padded(k_cache, table, live, compute)  # (S, Hkv, L, D)
        v = _gather_padded(v_cache, table, live, compute)
        # query i of seq s (i < n_s) sits at position ctx_s - n_s + i; padded queries are
        # dropped below but still need one live key, so they see position 0
        i = torch.arange(width, device=q.device)  # [W]
        valid = i[None, :] < n[:, None]  # [S, W]
        pos = torch.where(valid, ctx[:, None] - n[:, None] + i[None, :], 0)  # [S, W]
        rows = torch.tensor([starts[s] for s in short], device=q.device)[:, None] + i  # [S, W]
        rows = torch.where(valid, rows, rows[:, :1])
        qs = q[rows].to(compute).transpose(1, 2)  # (S, H, W, D)
        mask = keys[None, None, :] <= pos[:, :, None]  # (S, W, L)
        o = attend(qs, k, v, attn_mask=mask[:, None]).transpose(1, 2)  # (S, W, H, D)
        out[rows[valid]] = o[valid].to(q.dtype)
    for s in range(len(lens)):
        a, b, ctx = starts[s], starts[s + 1], lens[s]
        if b - a <= SHORT_QUERY:
            continue
        blocks = block_tables[s, : -(-ctx // block_size)].long()
        k = _gather_one(k_cache, blocks, ctx, compute)  # (Hkv, ctx, D)
        v = _gather_one(v_cache, blocks, ctx, compute)
        qs = q[a:b].transpose(0, 1).to(compute)  # (H, n, D)
        if b - a == ctx:  # nothing cached before: the usual top-left causal mask
            o = attend(qs, k, v, is_causal=True)
        else:  # query i sits at position ctx - n + i, after the cached prefix
            pos = torch.arange(ctx - (b - a), ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= pos[:, None]  # (n, ctx)
            o = attend(qs, k, v, attn_mask=mask)
        out[a:b] = o.transpose(0, 1).to(q.dtype)
    return out


def _gather_one(cache, blocks, ctx, compute):
    """One sequence's first ctx tokens, contiguous: (Hkv, ctx, D)."""
    kv = cache.index_select(0, blocks).flatten(0, 1)[:ctx].to(compute)  # (ctx, Hkv, D)
    return kv.transpose(0, 1)


def _gather_padded(cache, table, live, compute):
    """Padded contexts of several sequences, zero past each one: (S, Hkv, L, D)."""
    kv = cache[table].flatten(1, 2).to(compute)  # (S, L, Hkv, D), a fresh copy
    # Zeroed, not just masked: a NaN in a stale slot would reach the output as 0 * NaN.
    kv.masked_fill_(~live[:, :, None, None], 0.0)
    return kv.transpose(1, 2)
