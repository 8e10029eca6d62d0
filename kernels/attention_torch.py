"""The torch path of paged attention on the CPU (kernels.attention_plan runs it where the compiled
kernel does not): the keys gathered out of the paged cache into reused buffers, and SDPA over
them, or, with a soft-cap on the scores, the same written out."""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F


def attend_grouped(q, k, v, mask, scale: float, softcap: float | None = None):
    """SDPA of q (S, W, H, D) over k, v (S, Hkv, L, D) -> (S, W, H, D), with the g = H / Hkv
    query heads of a KV head as g * W queries of one head: one plain SDPA, no K/V copies, and
    cheaper than enable_gqa (up to 1.5x on long contexts).

    mask (S, 1, W, L): the same for every head, so it repeats once per query head.
    """
    num, width, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qs = q.permute(0, 2, 1, 3).reshape(num, kv_heads, group * width, dim)  # head-major, then W
    if width > 1:
        mask = mask.repeat(1, 1, group, 1)  # (S, 1, g * W, L)
    if softcap is None:
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
    else:
        o = attend_capped(qs, k, v, attn_mask=mask, scale=scale, softcap=softcap)
    return o.view(num, heads, width, dim).transpose(1, 2)


def attend_capped(q, k, v, *, attn_mask, scale: float, softcap: float, enable_gqa=False):
    """SDPA with each score s first capped to softcap * tanh(s / softcap): q (..., Hq, n, D)
    over k, v (..., Hkv, L, D); attn_mask broadcast over heads, True where a key is seen."""
    if q.shape[-3] != k.shape[-3]:  # GQA: each KV head serves its group of query heads
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def gather_one(cache, blocks, ctx, compute, which: int):
    """One sequence's first ctx tokens, contiguous: (Hkv, ctx, D)."""
    kv = _gather_blocks(cache, blocks, compute, which).flatten(0, 1)[:ctx]  # (ctx, Hkv, D)
    return kv.transpose(0, 1)


def gather_padded(cache, table, stale, compute, which: int):
    """Padded contexts of several sequences, zero past each one: (S, Hkv, L, D)."""
    kv = _gather_blocks(cache, table.flatten(), compute, which)  # (S * L / block, block, Hkv, D)
    kv = kv.view(table.shape[0], -1, *cache.shape[2:])  # (S, L, Hkv, D), a copy
    # Zeroed, not just masked: a NaN in a stale slot would reach the output as 0 * NaN. Only
    # the stale keys are written, not the whole copy again.
    if stale.numel():
        kv.view(-1, *kv.shape[2:]).index_fill_(0, stale, 0.0)
    return kv.transpose(1, 2)


def _gather_blocks(cache, blocks, compute, which: int):
    """cache[blocks] in compute's dtype, (n, block, Hkv, D), written into a reused buffer.

    A fresh tensor of a few MB per layer comes from mmap and is page-faulted in on every
    call: 5-6 ms per layer in the medium bench's decode steps (3 MB), 0.3-0.5 ms reused. The layers
    of a step run one after another and each is done with its copy before the next gathers,
    so one buffer per (K or V, dtype) serves them all.
    """
    # index_select rather than cache[blocks]: the same copy, about 1.7x faster on the CPU
    shape = (blocks.shape[0], *cache.shape[1:])
    if cache.dtype == compute:
        return torch.index_select(
            cache, 0, blocks, out=_scratch(shape, compute, which, cache.device)
        )
    low = torch.index_select(
        cache, 0, blocks, out=_scratch(shape, cache.dtype, which, cache.device)
    )
    return _scratch(shape, compute, which + 2, cache.device).copy_(low)


_workspace = threading.local()  # per thread: an engine and its draft model run in one


def _scratch(shape, dtype, which: int, device) -> torch.Tensor:
    """A [shape] view of this thread's buffer `which` for dtype, grown (never shrunk) to fit."""
    buffers = _workspace.__dict__.setdefault("buffers", {})
    numel, key = math.prod(shape), (which, dtype, device)
    buf = buffers.get(key)
    if buf is None or buf.numel() < numel:
        # A normal tensor, not an inference one: a forward under no_grad writes it as well as
        # one under inference_mode (an inference tensor refuses writes outside the mode)
        with torch.inference_mode(False):
            buf = buffers[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel].view(shape)
