"""paged_attention and write_kv against the float64 oracle, on both backends.

The torch path runs through the dispatch point; the Triton kernel is called
through its launcher on CPU tensors, in the interpreter (set in conftest) and
in fp32/fp16 only. Every cache slot outside a context holds NaN, and block
table entries past a context are -1 or name a NaN block, so any read past a
context shows up as a NaN in the output.
"""

from functools import partial

import pytest
import torch

from kernels import paged_attention, write_kv
from kernels.paged_attention_triton import paged_attention_triton
from tests.kernels.attention_oracle import attention_oracle, make_batch

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}  # atol = rtol, on O(1) outputs

# (new tokens, context length) per sequence
MIXED = ((7, 7), (1, 13), (5, 17), (1, 1), (12, 12), (1, 8), (0, 6))
CHUNKED = ((20, 40), (3, 3), (1, 33), (16, 21))
DECODES = ((1, 5), (1, 16), (1, 17), (1, 40), (1, 1))
PREFILLS = ((40, 40), (9, 9), (1, 1))

# layout, (num_heads, num_kv_heads), head_dim, block_size
CASES = [
    (MIXED, (4, 4), 16, 4),
    (MIXED, (6, 3), 32, 5),
    (MIXED, (6, 2), 16, 16),
    (CHUNKED, (6, 2), 16, 4),
    (CHUNKED, (2, 2), 24, 16),
    (DECODES, (6, 3), 16, 4),
    (DECODES, (6, 2), 32, 16),
    (PREFILLS, (3, 1), 16, 8),
]


def case_id(case):
    layout, (h, hkv), d, bs = case
    name = {MIXED: "mixed", CHUNKED: "chunked", DECODES: "decodes", PREFILLS: "prefills"}[layout]
    return f"{name}-H{h}kv{hkv}-D{d}-bs{bs}"


BACKENDS = {
    "torch": paged_attention,
    "triton": paged_attention_triton,
    "triton16": partial(paged_attention_triton, block_m=16, block_n=16),  # more tile edges
}


def batch_for(case, dtype, seed=0):
    layout, (num_heads, num_kv_heads), head_dim, block_size = case
    return make_batch(
        layout,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        seed=seed,
    )


def check(batch, out):
    want = attention_oracle(*batch.args())
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    assert torch.isfinite(out).all(), "read a NaN slot: something past a context was loaded"
    tol = TOLERANCE[batch.q.dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_oracle(backend, case, dtype):
    batch = batch_for(case, dtype)
    check(batch, BACKENDS[backend](*batch.args()))


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=case_id)
def test_triton_small_tiles(case):
    batch = batch_for(case, torch.float32, seed=1)
    check(batch, BACKENDS["triton16"](*batch.args()))


def test_torch_path_in_and_out_of_inference_mode():
    """The CPU path's reused K/V buffers serve a forward under inference_mode, then under
    no_grad and plain (each oracle-checked), whichever mode first made them, and a larger
    batch after a smaller one."""
    small, large = (batch_for(CASES[i], torch.float32, seed=3) for i in (5, 3))
    with torch.inference_mode():
        check(small, paged_attention(*small.args()))
    with torch.no_grad():
        check(large, paged_attention(*large.args()))
    check(small, paged_attention(*small.args()))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_strided_q(backend):
    """q as a view of a fused qkv projection: [num_tokens, num_heads + 2 * num_kv_heads, D]."""
    batch = batch_for(CASES[1], torch.float32, seed=2)
    qkv = torch.randn(batch.q.shape[0], 12, batch.q.shape[2])
    qkv[:, :6] = batch.q
    batch.q = qkv[:, :6]
    check(batch, BACKENDS[backend](*batch.args()))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_block_table_tail_never_read(backend):
    """Contexts ending exactly on a block edge, with the next table entry naming a NaN block."""
    batch = make_batch(
        ((8, 8), (1, 4), (3, 12)), num_heads=2, num_kv_heads=1, head_dim=16, block_size=4,
        dtype=torch.float32,
    )  # fmt: skip
    spare = int(batch.block_tables[0, -1])
    assert batch.k_cache[spare].isnan().all()
    for s, ctx in enumerate(batch.context_lens.tolist()):
        batch.block_tables[s, ctx // 4 :] = spare
    check(batch, BACKENDS[backend](*batch.args()))


def test_write_kv_round_trip():
    gen = torch.Generator().manual_seed(4)
    num_blocks, block_size, hkv, d = 5, 4, 2, 8
    k_cache = torch.full((num_blocks, block_size, hkv, d), torch.nan)
    v_cache = k_cache.clone()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:9]
    slots[[2, 5]] = -1  # padding tokens
    k = torch.randn(9, hkv, d, generator=gen)
    v = torch.randn(9, hkv, d, generator=gen)
    write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    live = slots >= 0
    assert torch.equal(flat_k[slots[live]], k[live])
    assert torch.equal(flat_v[slots[live]], v[live])
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[slots[live]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


def test_write_then_attend():
    """write_kv rebuilds a batch's cache from its tokens' K/V; attention over it is unchanged."""
    batch = batch_for(CASES[1], torch.float32, seed=5)
    block_size, hkv, d = batch.k_cache.shape[1:]
    slots = [
        int(batch.block_tables[s, p // block_size]) * block_size + p % block_size
        for s, ctx in enumerate(batch.context_lens.tolist())
        for p in range(ctx)
    ]
    slots = torch.tensor([-1, *slots, -1])  # padding tokens at both ends
    live = (slots >= 0)[:, None, None]
    k = batch.k_cache.view(-1, hkv, d)[slots.clamp(min=0)].masked_fill(~live, 0.0)
    v = batch.v_cache.view(-1, hkv, d)[slots.clamp(min=0)].masked_fill(~live, 0.0)
    k_cache = torch.full_like(batch.k_cache, torch.nan)
    v_cache = torch.full_like(batch.v_cache, torch.nan)
    write_kv(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, batch.k_cache, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, batch.v_cache, atol=0, rtol=0, equal_nan=True)
    batch.k_cache, batch.v_cache = k_cache, v_cache
    check(batch, paged_attention(*batch.args()))


def _bad_args():
    b = make_batch(((3, 5), (1, 4)), num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                   dtype=torch.float32)  # fmt: skip
    out_of_range = b.block_tables.clone()
    out_of_range[0, 1] = 99
    return b, [
        ("q dims", {"q": b.q[0]}, r"q: expected 3 dimensions"),
        ("q dtype", {"q": b.q.double()}, r"q: expected dtype in"),
        ("cache dtype", {"k_cache": b.k_cache.half()}, r"k_cache: expected dtype in \(float32\)"),
        ("v shape", {"v_cache": b.v_cache[:-1]}, r"v_cache: expected shape"),
        ("block_size", {"k_cache": torch.zeros(3, 0, 2, 8), "v_cache": torch.zeros(3, 0, 2, 8)},
         r"k_cache: expected a block_size"),
        ("head_dim", {"q": torch.randn(4, 4, 16)}, r"k_cache: expected head_dim 16"),
        ("gqa", {"q": torch.randn(4, 3, 8)}, r"q: expected num_heads to be a multiple of"),
        ("table dtype", {"block_tables": b.block_tables.float()}, r"block_tables: expected dtype"),
        ("ctx shape", {"context_lens": b.context_lens[:1]}, r"context_lens: expected shape \(2,\)"),
        ("qsl shape", {"query_start_loc": b.query_start_loc[:2]}, r"query_start_loc: expected shape"),
        ("qsl end", {"query_start_loc": torch.tensor([0, 3, 3], dtype=torch.int32)},
         r"query_start_loc: expected to run from 0 to num_tokens 4"),
        ("qsl order", {"query_start_loc": torch.tensor([0, 5, 4], dtype=torch.int32)},
         r"query_start_loc: decreases at seq 1"),
        ("ctx short", {"context_lens": torch.tensor([2, 4], dtype=torch.int32)},
         r"context_lens: seq 0 has 3 new tokens but a context of 2"),
        ("table short", {"context_lens": torch.tensor([5, 40], dtype=torch.int32)},
         r"block_tables: seq 1 needs 10 blocks"),
        ("table range", {"block_tables": out_of_range}, r"block_tables: seq 0 names a block outside"),
        ("scale", {"scale": None}, r"scale: expected a finite float"),
        ("scale nan", {"scale": float("nan")}, r"scale: expected a finite float"),
    ]  # fmt: skip


BAD_BATCH, BAD_CASES = _bad_args()
NAMES = ("q", "k_cache", "v_cache", "block_tables", "context_lens", "query_start_loc", "scale")


@pytest.mark.parametrize(
    ("kw", "message"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES]
)
def test_paged_attention_rejects(kw, message):
    args = dict(zip(NAMES, BAD_BATCH.args())) | kw
    with pytest.raises(ValueError, match=message):
        paged_attention(**args)


WRITE_CASES = [
    ("k dims", {"k": torch.randn(3, 8)}, r"k: expected 3 dimensions"),
    ("v shape", {"v": torch.randn(2, 2, 8)}, r"v: expected shape \(3, 2, 8\)"),
    ("k heads", {"k": torch.randn(3, 1, 8), "v": torch.randn(3, 1, 8)}, r"k: expected \[num_tokens, 2, 8\]"),
    ("cache dtype", {"v_cache": torch.zeros(4, 4, 2, 8).half()}, r"v_cache: expected dtype"),
    ("strided", {"k_cache": torch.zeros(4, 8, 2, 4).transpose(1, 3), "v_cache": torch.zeros(4, 4, 2, 8)},
     r"k_cache: expected a contiguous tensor"),
    ("slot dtype", {"slot_mapping": torch.zeros(3)}, r"slot_mapping: expected dtype"),
    ("slot shape", {"slot_mapping": torch.zeros(2, dtype=torch.long)}, r"slot_mapping: expected shape \(3,\)"),
    ("slot range", {"slot_mapping": torch.tensor([0, 16, -1])}, r"slot_mapping: expected slots in \[-1, 16\)"),
    ("slot -2", {"slot_mapping": torch.tensor([0, -2, 1])}, r"slot_mapping: expected slots in"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "message"), [c[1:] for c in WRITE_CASES], ids=[c[0] for c in WRITE_CASES]
)
def test_write_kv_rejects(kw, message):
    args = {
        "k": torch.randn(3, 2, 8),
        "v": torch.randn(3, 2, 8),
        "k_cache": torch.zeros(4, 4, 2, 8),
        "v_cache": torch.zeros(4, 4, 2, 8),
        "slot_mapping": torch.tensor([0, 5, -1]),
    } | kw
    with pytest.raises(ValueError, match=message):
        write_kv(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dispatch_on_cuda_matches_cpu(dtype):
    """On CUDA the dispatch point runs Triton; it agrees with the torch path on the CPU."""
    seqs = ((300, 300), (1, 517), (64, 200), (1, 1), (129, 129), (1, 64), (7, 1000))
    batch = make_batch(seqs, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
                       dtype=dtype, seed=7)  # fmt: skip
    want = paged_attention(*batch.args()).double()
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in batch.args()]
    got = paged_attention(*args).cpu().double()
    assert torch.isfinite(got).all()
    tol = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
