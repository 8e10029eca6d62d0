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

With a sliding window, a block wholly below a sequence's first query's window is never read,
and its entry may be -1 (a block the sequence released: serving/engine/kv_window.py). With
window 4 above, seq 1 (first query at 9, window from 6) could name [-1, 5, 3].

Prefill (n_s == context_len), prefill on top of cached prefix blocks, chunked
prefill and decode (n_s == 1) all mix in one batch. The checks read the small
index tensors on the host, so on CUDA they cost a device sync per call: a model checks a
step once and runs every layer through the unchecked entries with one AttentionPlan
(kernels.attention_plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

from kernels.attention_plan import (
    AttentionPlan,
    paged_attention_planned,
    plan_attention,
    plan_writes,
    write_kv_planned,
)
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
    check_write_kv(k, v, k_cache, v_cache, slot_mapping)
    write_kv_planned(k, v, k_cache, v_cache, plan_writes(slot_mapping))


def check_write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """ValueError naming the argument when write_kv's arguments are not as it documents."""
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


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its context in the paged cache.

    Semantics:  query i of seq s sits at position p = context_lens[s] - n_s + i and
                out = softmax(q k^T * scale) v over cache positions w..p of seq s,
                w = 0, or with a sliding window max(0, p - window + 1), and with a
                softcap each score s = softcap * tanh(s / softcap) (Gemma 2),
                head h reading kv head h // (num_heads // num_kv_heads)       (GQA)

    q: [num_tokens, num_heads, head_dim], the new tokens of all sequences
    concatenated; k_cache, v_cache: [num_blocks, block_size, num_kv_heads,
    head_dim], q's dtype, holding the new tokens already (write_kv first);
    block_tables: [num_seqs, max_blocks_per_seq] int (entries past a context
    are never read, nor, with a window, those of blocks wholly below seq s's first query's
    window, which may be -1: released); context_lens: [num_seqs] int, cached tokens including the
    new ones; query_start_loc: [num_seqs + 1] int, seq s's queries are
    q[query_start_loc[s]:query_start_loc[s + 1]]. Returns a new tensor shaped
    and typed like q.
    """
    args = (block_tables, context_lens, query_start_loc)
    starts, lens = check_paged_attention(q, k_cache, v_cache, *args, scale, window, softcap)
    plan = plan_attention(*args, k_cache.shape[1], k_cache.shape[0], starts, lens)
    return paged_attention_planned(q, k_cache, v_cache, plan, float(scale), window, softcap)


def check_paged_attention(q, k_cache, v_cache, block_tables, context_lens, query_start_loc,
                          scale, window=None, softcap=None) -> tuple[list[int], list[int]]:  # fmt: skip
    """ValueError naming the argument when paged_attention's arguments are not as it
    documents; else the host copies of query_start_loc and context_lens."""
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
    _check_window(window)
    if softcap is not None and (not isinstance(softcap, Real) or isinstance(softcap, bool)
                                or not math.isfinite(softcap) or softcap <= 0):  # fmt: skip
        raise ValueError(f"softcap: expected a positive float or None, got {softcap!r}")
    return _check_batch(k_cache, block_tables, context_lens, query_start_loc, num_tokens,
                        window=window)  # fmt: skip


def checked_plan(
    k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    slot_mapping: torch.Tensor,
    host: HostIndex | None = None,
    window: int | None = None,
) -> AttentionPlan:
    """A step's AttentionPlan (with its KV writes), once its batch is checked as
    paged_attention and write_kv check theirs: for a model that runs every layer unchecked.

    k_cache: one layer's cache (every layer's has its shape). host: the same index tensors
    as Python lists, when the caller built them from lists: then nothing is read back from
    the device (no sync on CUDA). window: the widest window of the layers when every layer
    has one (None: some layer reads the whole context): table entries of blocks wholly below
    a sequence's first query's window may then be -1, as paged_attention allows them.
    """
    num_blocks, block_size = k_cache.shape[:2]
    num_tokens = slot_mapping.shape[0] if slot_mapping.dim() == 1 else -1
    check_tensor("slot_mapping", slot_mapping, dim=1, dtypes=INDEX_DTYPES, device=k_cache.device)
    _check_window(window)
    starts, lens = _check_batch(k_cache, block_tables, context_lens, query_start_loc, num_tokens,
                                host, window)  # fmt: skip
    slots = list(host.slots) if host is not None else slot_mapping.tolist()
    num_slots = num_blocks * block_size
    if any(not -1 <= x < num_slots for x in slots):
        raise ValueError(f"slot_mapping: expected slots in [-1, {num_slots}) (-1 = skip)")
    writes = plan_writes(slot_mapping, slots)
    return plan_attention(block_tables, context_lens, query_start_loc, block_size, num_blocks,
                          starts, lens, writes)  # fmt: skip


@dataclass(frozen=True)
class HostIndex:
    """A step's index tensors as the Python lists they were built from (read with no sync)."""

    query_starts: tuple[int, ...]  # query_start_loc
    context_lens: tuple[int, ...]
    slots: tuple[int, ...]  # slot_mapping
    block_tables: tuple[tuple[int, ...], ...]  # each row as long as the tensor's
    adapter_slots: tuple[int, ...] | None = None  # per token; None: the step has no slab
    logits_rows: tuple[int, ...] | None = None  # logits_indices


def _check_window(window) -> None:
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)
                               or window < 1):  # fmt: skip
        raise ValueError(f"window: expected a positive int or None, got {window!r}")


def _check_caches(k_cache, v_cache, *, dtype, device) -> None:
    check_tensor("k_cache", k_cache, dim=4, dtypes=(dtype,), device=device)
    check_tensor("v_cache", v_cache, dim=4, dtypes=(dtype,), device=device)
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if k_cache.shape[1] == 0:
        raise ValueError("k_cache: expected a block_size (dimension 1) of at least 1, got 0")


def _check_batch(k_cache, block_tables, context_lens, query_start_loc, num_tokens, host=None,
                 window=None):  # fmt: skip
    """The host copies of query_start_loc and context_lens, once they describe a valid batch
    (read from host, a HostIndex, when given)."""
    device = k_cache.device
    num_blocks, block_size = k_cache.shape[:2]
    check_tensor("block_tables", block_tables, dim=2, dtypes=INDEX_DTYPES, device=device)
    num_seqs, max_blocks = block_tables.shape
    check_tensor("context_lens", context_lens, dim=1, dtypes=INDEX_DTYPES, device=device)
    check_shape("context_lens", context_lens, (num_seqs,))
    check_tensor("query_start_loc", query_start_loc, dim=1, dtypes=INDEX_DTYPES, device=device)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    if host is not None:
        starts, lens = list(host.query_starts), list(host.context_lens)
    else:
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
    # Only the entries a context covers must name real blocks, but for -1 (released) below
    # the first query's window; the rest may be anything.
    unread = [_unread_blocks(lens[s], starts[s + 1] - starts[s], window, block_size)
              for s in range(num_seqs)]  # fmt: skip
    where = " (-1 only below its first query's window)" if window is not None else ""
    if host is not None:
        for s, (row, ctx) in enumerate(zip(host.block_tables, lens)):
            low, needed = unread[s], -(-ctx // block_size)
            if any(not 0 <= b < num_blocks for b in row[low:needed]) or any(
                b != -1 and not 0 <= b < num_blocks for b in row[:low]
            ):
                raise ValueError(f"block_tables: seq {s} names a block outside [0, "
                                 f"{num_blocks}) within its context{where}")  # fmt: skip
        return starts, lens
    needed = torch.tensor([-(-c // block_size) for c in lens], device=device)
    cols = torch.arange(max_blocks, device=device)[None, :]
    bad = (cols < needed[:, None]) & ((block_tables < 0) | (block_tables >= num_blocks))
    if window is not None:
        below = cols < torch.tensor(unread, device=device)[:, None]
        bad &= ~(below & (block_tables == -1))
    if num_seqs and bool(bad.any()):
        s = int(bad.any(dim=1).nonzero()[0])
        raise ValueError(
            f"block_tables: seq {s} names a block outside [0, {num_blocks}) within its "
            f"context{where}"
        )
    return starts, lens


def _unread_blocks(ctx: int, n: int, window: int | None, block_size: int) -> int:
    """How many leading blocks of a context of ctx tokens, n of them new, no query reads:
    those wholly below the first query's window (none without a window)."""
    if window is None:
        return 0
    return max(0, ctx - n - window + 1) // block_size
