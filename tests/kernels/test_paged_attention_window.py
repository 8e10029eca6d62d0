"""paged_attention with a sliding window and a soft-cap on the scores, on every backend, against
the float64 oracle; that no backend reads below its queries' windows, where a sequence's table
may name -1 (blocks it released); and that the checks allow -1 there only."""

import pytest
import torch

from kernels import HostIndex, attention_native, checked_plan, paged_attention
from tests.kernels.attention_oracle import attention_oracle, make_batch
from tests.kernels.test_paged_attention import BACKENDS, CASES, batch_for

# (new tokens, context length) with contexts past a window of 6: decodes, verifications,
# chunks on a cached prefix, and prompts that slide through it
WINDOWED = ((1, 5), (1, 23), (5, 30), (12, 12), (20, 41), (1, 6), (3, 7))


def forget_below_windows(batch, window):
    """The batch with every block wholly below all its queries' windows named -1 in the
    table and filled with NaN: a kernel that reads one shows NaN (or fails)."""
    block_size = batch.k_cache.shape[1]
    starts = batch.query_start_loc.tolist()
    for s, ctx in enumerate(batch.context_lens.tolist()):
        n = starts[s + 1] - starts[s]
        lowest = max(0, ctx - n - window + 1)  # the first key any of its queries sees
        for b in range(lowest // block_size):
            block = int(batch.block_tables[s, b])
            batch.k_cache[block], batch.v_cache[block] = torch.nan, torch.nan
            batch.block_tables[s, b] = -1
    return batch


@pytest.mark.parametrize("window", [1, 6, 16])
@pytest.mark.parametrize("backend", ["torch", "triton", "triton16"])
def test_sliding_window_matches_the_oracle(backend, window):
    batch = make_batch(WINDOWED, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=11)  # fmt: skip
    want = attention_oracle(*batch.args(), window)
    got = BACKENDS[backend](*batch.args(), window=window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    # and a window as wide as every context is no window at all
    torch.testing.assert_close(BACKENDS[backend](*batch.args(), window=41),
                               BACKENDS[backend](*batch.args()), atol=1e-6, rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize("window", [1, 6])
@pytest.mark.parametrize("backend", ["triton", "triton16"])
def test_triton_never_reads_below_the_windows(backend, window):
    batch = make_batch(WINDOWED, num_heads=4, num_kv_heads=4, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=12)  # fmt: skip
    want = attention_oracle(*batch.args(), window)
    got = BACKENDS[backend](*forget_below_windows(batch, window).args(), window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def nan_at_block_zero(batch):
    """The batch with block 0 a NaN block no context reads (ids swapped with a spare one):
    a path that maps -1 onto block 0 and lets its values through shows NaN."""
    spare = int(batch.block_tables[0, -1])  # past every context: a NaN block (make_batch)
    for cache in (batch.k_cache, batch.v_cache):
        cache[[0, spare]] = cache[[spare, 0]]
    zero, other = batch.block_tables == 0, batch.block_tables == spare
    batch.block_tables[zero], batch.block_tables[other] = spare, 0
    assert batch.k_cache[0].isnan().all()
    return batch


@pytest.mark.parametrize("window", [1, 6])
@pytest.mark.parametrize("backend", ["torch", "native", "triton", "triton16"])
def test_released_blocks_below_the_windows_change_nothing(backend, window, monkeypatch):
    """Tables with -1 (released) for every block wholly below a sequence's windows, those
    blocks NaN: the same output as the full tables, on the torch path (short queries padded
    and masked, prefill chunks gathered from the window's first block), the C kernel, and
    Triton (fp32, in the interpreter here)."""
    if backend == "native" and not attention_native.available():
        pytest.skip("no compiled CPU attention kernel here")
    if backend == "torch":
        monkeypatch.setattr(attention_native, "available", lambda: False)
    run = paged_attention if backend in ("torch", "native") else BACKENDS[backend]
    batch = make_batch(WINDOWED, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=13)  # fmt: skip
    batch = nan_at_block_zero(batch)
    full = run(*batch.args(), window=window)
    released = forget_below_windows(batch, window)
    assert (released.block_tables == -1).sum() >= 10  # (20, 41) alone releases 5 blocks
    got = run(*released.args(), window=window)
    assert torch.isfinite(got).all(), "read a released block"
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.double(), attention_oracle(*batch.args(), window),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def _host_index(batch) -> HostIndex:
    """The batch's index tensors as lists, with the slots of its new tokens."""
    block_size = batch.k_cache.shape[1]
    starts, lens = batch.query_start_loc.tolist(), batch.context_lens.tolist()
    tables = [tuple(row) for row in batch.block_tables.tolist()]
    slots = [tables[s][p // block_size] * block_size + p % block_size
             for s, ctx in enumerate(lens) for p in range(ctx - starts[s + 1] + starts[s], ctx)]  # fmt: skip
    return HostIndex(tuple(starts), tuple(lens), tuple(slots), tuple(tables))


def _plan(batch, window, host: bool):
    index = _host_index(batch)
    return checked_plan(batch.k_cache, batch.block_tables, batch.context_lens,
                        batch.query_start_loc, torch.tensor(index.slots),
                        index if host else None, window)  # fmt: skip


@pytest.mark.parametrize("host", [True, False], ids=["host", "device"])
def test_the_checks_allow_released_blocks_below_the_window_only(host):
    window = 6
    batch = forget_below_windows(make_batch(WINDOWED, num_heads=2, num_kv_heads=1,
                                            head_dim=8, block_size=4, dtype=torch.float32),
                                 window)  # fmt: skip
    _plan(batch, window, host)  # below every window: allowed
    paged_attention(*batch.args(), window=window)
    bad = "names a block outside .* within its context"
    with pytest.raises(ValueError, match=bad):  # without a window, -1 is never allowed
        _plan(batch, None, host)
    with pytest.raises(ValueError, match=bad):
        paged_attention(*batch.args())
    with pytest.raises(ValueError, match=bad):  # a wider window reads the released blocks
        _plan(batch, window + 4, host)
    # Seq 4 (20 new tokens of 41): its first query at 21 sees keys from 16, block 4 on.
    for entry in (4, 5, 10):  # the window's first block, a later one, the query's own
        table = batch.block_tables.clone()
        batch.block_tables[4, entry] = -1
        with pytest.raises(ValueError, match=r"seq 4 names a block outside"):
            _plan(batch, window, host)
        with pytest.raises(ValueError, match=r"seq 4 names a block outside"):
            paged_attention(*batch.args(), window=window)
        batch.block_tables = table
    batch.block_tables[4, 3] = -2  # below the window, but only -1 means released
    with pytest.raises(ValueError, match=r"seq 4 names a block outside"):
        _plan(batch, window, host)


def test_a_window_must_be_a_positive_int():
    batch = batch_for(CASES[0], torch.float32)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window: expected a positive int"):
            paged_attention(*batch.args(), window=bad)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("backend", ["torch", "triton", "triton16"])
def test_a_soft_cap_on_the_scores_matches_the_oracle(backend, window):
    """Scores well past the cap (q and k scaled up), so tanh bends them."""
    batch = make_batch(WINDOWED, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32, seed=15)  # fmt: skip
    batch.q *= 4.0
    want = attention_oracle(*batch.args(), window, 2.0)
    got = BACKENDS[backend](*batch.args(), window=window, softcap=2.0)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    uncapped = attention_oracle(*batch.args(), window)
    assert (uncapped - want).abs().max() > 1e-2  # the cap changed something


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_windows_and_soft_caps_on_cuda_match_the_oracle(dtype):
    """Gemma-sized heads (256) and a window of 1024 inside long prompts, on the device."""
    seqs = ((1500, 1500), (1, 2100), (64, 1200), (1, 9), (5, 1030))
    batch = make_batch(seqs, num_heads=8, num_kv_heads=4, head_dim=256, block_size=16,
                       dtype=dtype, seed=17)  # fmt: skip
    want = attention_oracle(*batch.args(), 1024, 50.0)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in batch.args()]
    got = paged_attention(*args, window=1024, softcap=50.0).cpu().double()
    assert torch.isfinite(got).all()
    tol = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
