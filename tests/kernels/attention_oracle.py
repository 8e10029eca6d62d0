"""A deliberately simple float64 reference for paged attention, and the paged batches it checks.

The oracle rebuilds each sequence's K and V token by token from the cache
(position p is in block block_tables[s, p // block_size], slot p % block_size),
then computes softmax(q k^T * scale + causal mask) v for each head with an
explicit exp and sum. No SDPA, no batching, no gather by blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def attention_oracle(
    q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale, window=None,
    softcap=None,
):  # fmt: skip
    """[num_tokens, num_heads, head_dim] float64; rows of no sequence come back NaN. With a
    window, query p sees keys p - window + 1 .. p only (and the rest is never read); with a
    softcap, each score s is softcap * tanh(s / softcap) before the softmax."""
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.full(q.shape, torch.nan, dtype=torch.float64)
    for s in range(len(context_lens)):
        a, b, ctx = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(context_lens[s])
        n = b - a
        if n == 0:
            continue
        low = 0 if window is None else max(0, ctx - n - window + 1)  # no query sees below
        where = [(int(block_tables[s, p // block_size]), p % block_size) for p in range(ctx)]
        where = [(0, 0)] * low + where[low:]  # a stand-in row, masked below
        k = torch.stack([k_cache[blk, off] for blk, off in where]).double()  # (ctx, Hkv, D)
        v = torch.stack([v_cache[blk, off] for blk, off in where]).double()
        k[:low], v[:low] = 0.0, 0.0
        positions = torch.arange(ctx - n, ctx)  # of the new tokens
        keys = torch.arange(ctx)[None, :]
        future = keys > positions[:, None]  # (n, ctx)
        if window is not None:
            future |= keys <= positions[:, None] - window
        for h in range(num_heads):
            scores = q[a:b, h].double() @ k[:, h // group].T * scale  # (n, ctx)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            scores = scores.masked_fill(future, -torch.inf)
            weights = torch.exp(scores - scores.max(dim=1, keepdim=True).values)
            weights = weights / weights.sum(dim=1, keepdim=True)
            out[a:b, h] = weights @ v[:, h // group]
    return out


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim], NaN where unused
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, -1 or a stale id past a context
    context_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    scale: float

    def args(self):
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.context_lens,
            self.query_start_loc,
            self.scale,
        )


def make_batch(
    seqs, *, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0, spare_blocks=3
) -> PagedBatch:
    """seqs: (new tokens, context length) per sequence. Blocks are handed out shuffled; every
    cache slot outside a context, and every spare block, holds NaN."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-ctx // block_size) for _, ctx in seqs]
    num_blocks = sum(needed) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, torch.nan, dtype=dtype)
    v_cache = torch.full(shape, torch.nan, dtype=dtype)
    max_blocks = max(needed, default=0) + 1
    # Past a context: -1, or a spare (NaN) block, as a stale table would hold.
    block_tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    block_tables[:, -1] = order[-1]
    for s, (_, ctx) in enumerate(seqs):
        blocks, order = order[: needed[s]], order[needed[s] :]
        block_tables[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        for p in range(ctx):
            blk, off = blocks[p // block_size], p % block_size
            k_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
            v_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
    counts = torch.tensor([0] + [n for n, _ in seqs])
    q = torch.randn(int(counts.sum()), num_heads, head_dim, generator=gen).to(dtype)
    return PagedBatch(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        context_lens=torch.tensor([ctx for _, ctx in seqs], dtype=torch.int32),
        query_start_loc=counts.cumsum(0).to(torch.int32),
        scale=head_dim**-0.5,
    )
