"""The compiled CPU attention kernel (kernels/attention_cpu.c) against the float64 oracle: every
layout of a step (decodes, verifications, prefill chunks, prompts longer than its query
chunk), what it leaves to torch, and the operands it refuses. Every cache slot
outside a context holds NaN (attention_oracle.make_batch), so a read past a query's position
shows as a NaN."""

import pytest
import torch

from kernels import attention_native, paged_attention
from kernels.attention_plan import paged_attention_planned, plan_attention
from tests.kernels.attention_oracle import attention_oracle, make_batch
from tests.kernels.test_lora_native import needs_compiler
from tests.kernels.test_paged_attention import CASES, batch_for, case_id, check
from tests.kernels.test_paged_attention_window import WINDOWED, forget_below_windows

pytestmark = needs_compiler

# (new tokens, context length): decodes, verifications of k + 1 = 5 and 17 tokens, contexts on
# and off block edges, prefills of one query chunk (32) and more, one on top of a cached prefix
SPECULATIVE = ((5, 40), (1, 3), (17, 17), (17, 70), (2, 33), (30, 30), (70, 70), (33, 100))


@pytest.fixture
def calls(monkeypatch):
    """The kernel's runs (calls that did the work)."""
    ran = []
    real = attention_native.attend

    def counted(*args):
        done = real(*args)
        ran.append(done)
        return done

    monkeypatch.setattr(attention_native, "attend", counted)
    return ran


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_layout_matches_the_oracle(case, calls):
    batch = batch_for(case, torch.float32, seed=5)
    check(batch, paged_attention(*batch.args()))
    assert calls == [True]  # one call for the whole step


@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_verification_widths_and_long_contexts(heads, threads, calls):
    batch = make_batch(SPECULATIVE, num_heads=heads[0], num_kv_heads=heads[1], head_dim=64,
                       block_size=16, dtype=torch.float32, seed=6)  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check(batch, paged_attention(*batch.args()))
    finally:
        torch.set_num_threads(before)
    assert calls == [True]


def test_the_same_outputs_as_the_torch_path(monkeypatch):
    """Within float32 rounding of torch's SDPA on a decode batch (64 rows, GQA 4/2) beside a
    300-token prompt and a chunk of one on top of its cached prefix."""
    layout = (*((1, 9 + 7 * i) for i in range(64)), (300, 300), (100, 400))
    batch = make_batch(layout, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                       dtype=torch.float32, seed=7)  # fmt: skip
    compiled = paged_attention(*batch.args())
    monkeypatch.setattr(attention_native, "available", lambda: False)
    torch.testing.assert_close(compiled, paged_attention(*batch.args()), atol=2e-6, rtol=2e-6)


def test_half_precision_and_a_switch_off_take_the_torch_path(monkeypatch, calls):
    batch = batch_for(CASES[5], torch.float16, seed=8)
    check(batch, paged_attention(*batch.args()))
    assert calls == [False]
    monkeypatch.setenv("LORASERVE_CPU_NATIVE", "0")
    attention_native._load.cache_clear()
    calls.clear()
    batch = batch_for(CASES[5], torch.float32, seed=8)
    check(batch, paged_attention(*batch.args()))
    try:
        assert not attention_native.available() and calls == []
    finally:
        attention_native._load.cache_clear()  # loaded again, as without the switch


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k: (q[:-1], k), "do not match the step's plan"),
        (lambda q, k: (q, k[:2]), "the plan's table names"),
        (lambda q, k: (q[..., :8], k), "do not match the step's plan"),
        # as many slots in more, smaller blocks: the table's ids would name other tokens
        (
            lambda q, k: (q, k.reshape(k.shape[0] * 2, k.shape[1] // 2, *k.shape[2:])),
            "do not match the step's plan",
        ),
    ],
    ids=["fewer tokens", "smaller cache", "head_dim", "block_size"],
)
def test_operands_other_than_the_plan_s_are_refused(change, message):
    """A plan's clamped table and spans bound the kernel's reads only for the operands it was
    made for: others are a ValueError, before the kernel reads anything."""
    batch = batch_for(CASES[5], torch.float32, seed=9)
    plan = plan_attention(batch.block_tables, batch.context_lens, batch.query_start_loc,
                          batch.k_cache.shape[1], batch.k_cache.shape[0])  # fmt: skip
    q, k_cache = change(batch.q, batch.k_cache)
    with pytest.raises(ValueError, match=message):
        paged_attention_planned(q.contiguous(), k_cache.contiguous(), k_cache.contiguous(), plan,
                                batch.scale)  # fmt: skip


@pytest.mark.parametrize("window", [1, 6, 16])
def test_a_sliding_window_reads_nothing_below_it(window, calls):
    batch = make_batch(WINDOWED, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=13)  # fmt: skip
    want = attention_oracle(*batch.args(), window)
    q, k, v, tables, lens, starts, scale = forget_below_windows(batch, window).args()
    plan = plan_attention(tables, lens, starts, k.shape[1], k.shape[0])  # unchecked: -1 entries
    got = paged_attention_planned(q, k, v, plan, scale, window)
    assert calls == [True] and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 6, 16])
def test_the_torch_path_takes_the_window_too(window, monkeypatch):
    """Its batched decodes and its one-by-one prefill chunks (torch reads the whole context
    and masks what the window leaves out)."""
    monkeypatch.setattr(attention_native, "available", lambda: False)
    batch = make_batch(WINDOWED, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=14)  # fmt: skip
    want = attention_oracle(*batch.args(), window)
    torch.testing.assert_close(paged_attention(*batch.args(), window=window).double(), want,
                               atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("compiled", [True, False])
def test_a_soft_cap_on_both_cpu_paths(compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(attention_native, "available", lambda: False)
    batch = make_batch(SPECULATIVE, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                       dtype=torch.float32, seed=16)  # fmt: skip
    batch.q *= 4.0
    want = attention_oracle(*batch.args(), 24, 3.0)
    got = paged_attention(*batch.args(), window=24, softcap=3.0)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
