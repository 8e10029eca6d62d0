"""One step's attention metadata, derived once and shared by every layer's attention.

Which sequences are short queries (decodes, verifications) and how they pad, which cache
slots the step writes, the longest query: none of it depends on the layer, and all of it
comes from small index tensors whose host values a caller usually has already (the engine
builds them from Python lists). plan_attention derives it once per step; write_kv_planned
and paged_attention_planned then run each layer without checks and without reading anything
back from the device. kernels.paged_attention's public functions check their arguments,
plan, and call these.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial
from itertools import pairwise

import torch
import torch.nn.functional as F

from kernels import attention_native
from kernels.attention_torch import attend_capped, attend_grouped, gather_one, gather_padded

SHORT_QUERY = 17  # queries per sequence up to which the batched path runs (k + 1 for k <= 16)


@dataclass(frozen=True)
class KVWrites:
    """Where write_kv_planned stores the step's tokens: rows[i] goes to slot slots[i]."""

    rows: torch.Tensor | None  # [W] int64 token rows with a slot; None: every row, in order
    slots: torch.Tensor  # [W] int64


@dataclass(frozen=True)
class ShortBatch:
    """Sequences attended as one batch (the compiled kernel's: all; the torch path's: the short
    queries, decodes and verifications): S sequences, the longest L keys."""

    table: torch.Tensor  # [S, L / block_size] int64 block ids, clamped into the cache
    named: torch.Tensor  # [S, L / block_size] the ids as the step's table names them (-1 too)
    spans: torch.Tensor  # [S, 3] int64: first query row, queries n_s, context length
    num_blocks: int  # the cache's, which table's ids are clamped below
    block_size: int

    @functools.cached_property
    def padded(self) -> PaddedShort:
        """Their padded batch for the torch path, made on its first use (once a step): the
        compiled path reads the cache in place and needs none of it."""
        return _padded(self)


@dataclass(frozen=True)
class PaddedShort:
    """The short queries as one padded batch (torch path): S sequences, W queries, L keys."""

    stale: torch.Tensor  # [n] int64, the keys past each context, flat in [S * L]
    rows: torch.Tensor  # [S, W] int64 query rows (padding repeats a sequence's first row)
    valid: torch.Tensor  # [S, W] bool, real queries
    mask: torch.Tensor  # [S, 1, W, L] bool, causal: query i of seq s sees keys <= its position
    out_rows: torch.Tensor  # [sum n_s] int64, rows[valid]
    pos: torch.Tensor  # [S, W] int64, each query's position (padding: 0)

    def in_window(self, window: int) -> torch.Tensor:
        """[S, 1, W, L] bool: the keys within `window` of each query (its own included)."""
        keys = torch.arange(self.mask.shape[-1], device=self.pos.device)
        return (keys[None, None, :] > self.pos[:, :, None] - window)[:, None]


@dataclass(frozen=True)
class AttentionPlan:
    """A step's batch: host copies of query starts and context lengths, and what follows."""

    starts: tuple[int, ...]  # query_start_loc
    lens: tuple[int, ...]  # context_lens
    block_tables: torch.Tensor  # [S, max_blocks] int
    context_lens: torch.Tensor  # [S] int
    query_start_loc: torch.Tensor  # [S + 1] int
    max_query_len: int
    short: ShortBatch | None  # None on CUDA (the Triton kernel takes the tables) or when none
    long: tuple[int, ...]  # sequences with more than SHORT_QUERY queries (torch path)
    every: ShortBatch | None = None  # every sequence with a query, on the CPU (compiled path)
    writes: KVWrites | None = None  # the step's KV writes (plan_writes), when planned with it


def plan_writes(slot_mapping: torch.Tensor, slots: list[int] | None = None) -> KVWrites:
    """KVWrites of slot_mapping ([T] int, -1 = skip); slots: its host copy, when known."""
    if slots is not None and min(slots, default=0) >= 0:  # no padding: every row, in order
        return KVWrites(None, slot_mapping.long())
    live = slot_mapping >= 0
    return KVWrites(live.nonzero()[:, 0], slot_mapping[live].long())


def plan_attention(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_size: int,
    num_blocks: int,
    starts: list[int] | None = None,
    lens: list[int] | None = None,
    writes: KVWrites | None = None,
) -> AttentionPlan:
    """The plan of a batch already known to be valid (see paged_attention's checks).

    starts, lens: host copies of query_start_loc and context_lens (read back when omitted).
    """
    starts = tuple(query_start_loc.tolist() if starts is None else starts)
    lens = tuple(context_lens.tolist() if lens is None else lens)
    counts = [b - a for a, b in pairwise(starts)]
    device = block_tables.device
    short = every = None
    long_ = ()
    if device.type != "cuda":
        picked = [s for s, n in enumerate(counts) if 1 <= n <= SHORT_QUERY]
        long_ = tuple(s for s, n in enumerate(counts) if n > SHORT_QUERY)
        queried = [s for s, n in enumerate(counts) if n]
        if queried:
            every = _short_batch(block_tables, starts, lens, queried, block_size, num_blocks)
        if picked:  # a step of decodes alone (the usual one) has them all short: the same batch
            short = every if picked == queried else _short_batch(
                block_tables, starts, lens, picked, block_size, num_blocks)  # fmt: skip
    return AttentionPlan(starts, lens, block_tables, context_lens, query_start_loc,
                         max(counts, default=0), short, long_, writes=writes, every=every)  # fmt: skip


def _short_batch(block_tables, starts, lens, picked, block_size, num_blocks) -> ShortBatch:
    blocks = -(-max(lens[s] for s in picked) // block_size)
    # Entries past a context may be -1 or stale, and those below a window -1 (released):
    # clamp for the gather (and the C kernel's reads)
    named = block_tables[picked, :blocks]
    table = named.long().clamp(0, num_blocks - 1)
    spans = torch.tensor([(starts[s], starts[s + 1] - starts[s], lens[s]) for s in picked],
                         dtype=torch.int64, device=block_tables.device)  # fmt: skip
    return ShortBatch(table, named, spans, num_blocks, block_size)


def _padded(b: ShortBatch) -> PaddedShort:
    device = b.spans.device
    first, n, ctx = b.spans.unbind(1)  # [S] each
    width = int(n.max())
    keys = torch.arange(b.table.shape[1] * b.block_size, device=device)  # [L]
    live = keys[None, :] < ctx[:, None]  # [S, L]
    # A released block (-1, wholly below the first query's window) reads block 0 through the
    # clamp, some other sequence's keys: masked by the window, and zeroed like the stale ones.
    live &= (b.named >= 0).repeat_interleave(b.block_size, dim=1)
    # query i of seq s (i < n_s) sits at position ctx_s - n_s + i; padded queries are
    # dropped but still need one live key, so they see position 0
    i = torch.arange(width, device=device)  # [W]
    valid = i[None, :] < n[:, None]  # [S, W]
    pos = torch.where(valid, ctx[:, None] - n[:, None] + i[None, :], 0)  # [S, W]
    rows = first[:, None] + i  # [S, W]
    rows = torch.where(valid, rows, rows[:, :1])
    mask = keys[None, None, :] <= pos[:, :, None]  # [S, W, L]
    stale = (~live).flatten().nonzero().squeeze(1)  # the CPU's own memory: no device sync
    return PaddedShort(stale, rows, valid, mask[:, None], rows[valid], pos)


def write_kv_planned(k, v, k_cache, v_cache, writes: KVWrites) -> None:
    """write_kv without checks: k_cache.view(-1, Hkv, D)[writes.slots] = k[writes.rows]."""
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if writes.rows is not None:
        k, v = k.index_select(0, writes.rows), v.index_select(0, writes.rows)
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, writes.slots, k)
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, writes.slots, v)


def paged_attention_planned(
    q, k_cache, v_cache, plan: AttentionPlan, scale: float, window: int | None = None,
    softcap: float | None = None,
):  # fmt: skip
    """paged_attention without checks, on a batch plan_attention derived."""
    if q.is_cuda:
        from kernels.paged_attention_triton import paged_attention_triton

        return paged_attention_triton(
            q, k_cache, v_cache, plan.block_tables, plan.context_lens, plan.query_start_loc,
            scale, max_query_len=plan.max_query_len, window=window, softcap=softcap,
        )  # fmt: skip
    return _attention_cpu(q, k_cache, v_cache, plan, scale, window, softcap)


def _attention_cpu(
    q, k_cache, v_cache, plan: AttentionPlan, scale: float, window: int | None,
    softcap: float | None = None,
):  # fmt: skip
    """The CPU path: every sequence in one compiled call where it runs (float32; 2-4x the
    speed of the torch path below, even for a 2,000-token prompt); else, in torch, the short
    queries in one batched SDPA call and every longer query on its own.

    GQA goes to SDPA (enable_gqa) rather than through copies of K/V per query head: a batch of
    decodes is bound by reading K/V, and the copies made it ~20x slower.
    """
    # float32 compute: fp16/bf16 softmax sums over thousands of keys drift, and the CPU is no
    # faster in half precision anyway.
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    attend = partial(F.scaled_dot_product_attention, scale=scale, enable_gqa=True)
    if softcap is not None:  # SDPA caps no scores: the same, written out
        attend = partial(attend_capped, scale=scale, softcap=softcap)
    if _attend_compiled(q, k_cache, v_cache, out, plan, scale, window, softcap):
        return out
    b = plan.short
    if b is not None:  # the same in torch: one padded, batched SDPA call
        p = b.padded
        k = gather_padded(k_cache, b.table, p.stale, compute, 0)  # (S, Hkv, L, D)
        v = gather_padded(v_cache, b.table, p.stale, compute, 1)
        mask = p.mask if window is None else p.mask & p.in_window(window)
        o = attend_grouped(q[p.rows].to(compute), k, v, mask, scale, softcap)  # (S, W, H, D)
        out[p.out_rows] = o[p.valid].to(q.dtype)
    starts, lens = plan.starts, plan.lens
    for s in plan.long:  # prefill chunks, one sequence at a time
        a, e, ctx = starts[s], starts[s + 1], lens[s]
        # Keys from the block of the first query's first in its window: the blocks below are
        # never read (their entries may be -1, released).
        low = 0 if window is None else max(0, ctx - (e - a) - window + 1) // block_size
        blocks = plan.block_tables[s, low : -(-ctx // block_size)].long()
        first = low * block_size  # the first gathered key's position
        k = gather_one(k_cache, blocks, ctx - first, compute, 0)  # (Hkv, ctx - first, D)
        v = gather_one(v_cache, blocks, ctx - first, compute, 1)
        qs = q[a:e].transpose(0, 1).to(compute)  # (H, n, D)
        if e - a == ctx and window is None and softcap is None:  # the top-left causal mask
            o = attend(qs, k, v, is_causal=True)
        else:  # query i sits at position ctx - n + i, after the cached prefix
            pos = torch.arange(ctx - (e - a), ctx, device=q.device)
            keys = torch.arange(first, ctx, device=q.device)[None, :]
            mask = keys <= pos[:, None]  # (n, ctx - first)
            if window is not None:
                mask &= keys > pos[:, None] - window
            o = attend(qs, k, v, attn_mask=mask)
        out[a:e] = o.transpose(0, 1).to(q.dtype)
    return out


def _attend_compiled(
    q, k_cache, v_cache, out, plan: AttentionPlan, scale: float, window: int | None,
    softcap: float | None,
) -> bool:  # fmt: skip
    """Every sequence of the plan in one compiled call, reading the cache in place; False,
    having done nothing, where the kernel is not here or does not take these operands."""
    b = plan.every
    if b is None or not attention_native.available():
        return False
    return attention_native.attend(q, k_cache, v_cache, out, b.spans, b.table, plan.starts[-1],
                                   b.num_blocks, b.block_size, scale, window, softcap)  # fmt: skip
