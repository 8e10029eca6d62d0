"""Triton kernel for paged_attention: causal varlen attention over a paged KV cache.

Grid: (sequences, query blocks of the longest query run, query heads). A
program holds BLOCK_M of its sequence's queries for one head and walks the
sequence's keys BLOCK_N at a time with an online softmax in float32 (Flash
Attention: Dao et al., 2022, arXiv:2205.14135). Each key's block id comes from
the block table, so a key tile may span several cache blocks and block_size
need not be a power of two. Keys past the last query's position are never
loaded, nor, with a sliding window, keys below the first query's window; programs past
their sequence's query count return at once.

Simplified: decodes use 1 row of a 16-row query tile, and each query head
reads its kv head's keys again (no packing of a GQA group into one tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    out_ptr,  # like q
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    context_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    scale,
    window,  # > 0: each query sees its own position and the window - 1 keys before it
    softcap,  # > 0: each score s becomes softcap * tanh(s / softcap)
    block_size,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bs,
    stride_bb,
    HEAD_DIM: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    m_block = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // QUERIES_PER_KV

    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= num_queries:
        return
    ctx = tl.load(context_lens_ptr + seq)

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the sequence
    mask_m = offs_m < num_queries
    pos = ctx - num_queries + offs_m  # its position in the sequence
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    tokens = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    # Finite start for the running max: a row with every key masked so far (a padding row, or
    # a real row whose window starts past this tile) then gives exp(-inf) = 0, not NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Keys up to the last query's position (causal), which is below ctx; with a window, from
    # the first query's first key (below it nothing is loaded, not even its table entry).
    kv_end = ctx - num_queries + tl.minimum((m_block + 1) * BLOCK_M, num_queries)
    kv_lo = 0
    if window > 0:
        kv_lo = tl.maximum(ctx - num_queries + m_block * BLOCK_M - window + 1, 0)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bs
    for start_n in range(kv_lo // BLOCK_N * BLOCK_N, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = (offs_n < kv_end) & (offs_n >= kv_lo)
        # int64 block ids: block * stride overflows int32 in a large cache
        table = table_row + (offs_n // block_size) * stride_bb
        blocks = tl.load(table, mask=mask_n, other=0).to(tl.int64)
        slots = offs_n % block_size
        kv_mask = mask_n[None, :] & mask_d[:, None]
        k = tl.load(
            k_cache_ptr
            + blocks[None, :] * stride_kb
            + slots[None, :] * stride_kt
            + kv_head * stride_kh
            + offs_d[:, None] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_N] float32
        if softcap > 0:  # tanh(x) = 1 - 2 / (e^2x + 1), finite at both ends
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        causal = (offs_n[None, :] <= pos[:, None]) & mask_n[None, :]
        if window > 0:
            causal = causal & (offs_n[None, :] > pos[:, None] - window)
        s = tl.where(causal, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_cache_ptr
            + blocks[:, None] * stride_vb
            + slots[:, None] * stride_vt
            + kv_head * stride_vh
            + offs_d[None, :] * stride_vd,
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    block_m: int | None = None,
    block_n: int = 32,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Launch the kernel; arguments already checked by kernels.paged_attention.

    max_query_len: the longest query run (n_s), read from query_start_loc when not given.
    window: a sliding window (None: the whole context); softcap: the scores' tanh cap.
    block_m, block_n: tile sizes (powers of two, at least 16); block_m follows
    max_query_len when not given. Tests shrink them to cross more tile boundaries.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_seqs = context_lens.shape[0]
    out = torch.empty_like(q)
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
    if num_tokens == 0 or max_query_len == 0:
        return out
    # tl.dot needs at least 16 along every side
    if block_m is None:
        block_m = 16 if max_query_len <= 16 else 32 if max_query_len <= 32 else 64
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        query_start_loc,
        scale,
        window or 0,
        softcap or 0.0,
        k_cache.shape[1],
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.stride(3),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        v_cache.stride(3),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        block_tables.stride(0),
        block_tables.stride(1),
        HEAD_DIM=head_dim,
        QUERIES_PER_KV=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
