"""The padded way of the CPU path, called as the model calls it: fused slices, host scales."""

import pytest
import torch

from kernels import build_segments, lora_apply_planned
from kernels.lora_reference import expand_oracle, shrink_oracle
from kernels.lora_torch import lora_expand_torch, lora_shrink_torch
from tests.kernels.cases import TOLERANCE

# (slot per token, rank per slot): decode with one token per adapter, four per adapter,
# uneven buckets (padding rows), two rank groups side by side, and longer runs of one slot
LAYOUTS = {
    "one each": ([3, 0, 2, 1, 5, 4], [8] * 6),
    "four each": ([0, 1, 2] * 4, [8, 8, 8]),
    "uneven": ([0, 2, 2, 0, -1, 2, 3], [4, 4, 4, 4]),
    "two ranks": ([1, 0, -1, 2, 0, 1, 3], [8, 3, 8, 3]),
    "long runs": ([1] * 5 + [-1] + [0] * 9, [8, 6]),  # whole blocks of four and the rest
}


def make(layout, dtype, widths, scales_kind, seed=0):
    gen = torch.Generator().manual_seed(seed)
    slots, ranks = LAYOUTS[layout]
    num_slots, hidden, max_rank = len(ranks), 48, 16

    def stack(cols):
        s = torch.randn(num_slots, max_rank, cols, generator=gen) / 4
        for slot, r in enumerate(ranks):
            s[slot, r:] = torch.nan  # past the rank: never to be read
        return s.to(dtype)

    a = tuple(stack(hidden) for _ in widths)
    b = tuple(stack(w) for w in widths)
    x = torch.randn(len(slots), hidden, generator=gen).to(dtype)
    scales = torch.full((num_slots,), 2.0) if scales_kind == "uniform" else torch.rand(num_slots)
    ids, rk = torch.tensor(slots, dtype=torch.int32), torch.tensor(ranks, dtype=torch.int32)
    segments = build_segments(ids, rk, host=(slots, ranks))
    return x, a, b, scales, ids, rk, segments


def each_padded_case(test):
    """Every layout, dtype, fusion, scale kind, with and without the host's scales."""
    for name, values in (("host", [True, False]), ("scales_kind", ["uniform", "per slot"]),
                         ("widths", [(40,), (40, 8, 8)]),
                         ("dtype", [torch.float32, torch.bfloat16]),
                         ("layout", sorted(LAYOUTS))):  # fmt: skip
        test = pytest.mark.parametrize(name, values)(test)
    return test


@each_padded_case
def test_padded_shrink_then_expand(layout, dtype, widths, scales_kind, host):
    x, a, b, scales, ids, ranks, segments = make(layout, dtype, widths, scales_kind)
    assert all(g.padded is not None for g in segments.cpu_plan.groups)
    t = torch.full((len(widths), x.shape[0], 16), -7777.0)
    lora_shrink_torch(x, a, t, segments)
    want_t = shrink_oracle(x, a, ids, ranks)
    live = ~want_t.isnan()
    assert (t[~live] == -7777.0).all(), "wrote a base-only row or a column past a rank"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(t[live].double(), want_t[live], atol=atol, rtol=rtol)

    t[~live] = torch.nan  # past the rank, t is garbage: never read it
    y = torch.randn(x.shape[0], sum(widths)).to(dtype)
    y_before = y.clone()
    host_scales = scales.tolist() if host else None
    lora_expand_torch(t, b, y, segments, scales, host_scales=host_scales)
    want = expand_oracle(y_before, t, b, ids, ranks, scales)
    base = ids < 0
    assert torch.equal(y[base], y_before[base]), "changed a row of a base-only token"
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)


@each_padded_case
def test_fused_apply_matches_shrink_then_expand_oracle(layout, dtype, widths, scales_kind, host):
    x, a, b, scales, ids, ranks, segments = make(layout, dtype, widths, scales_kind, seed=1)
    assert segments.cpu_plan.all_padded
    y = torch.randn(x.shape[0], sum(widths)).to(dtype)
    y_before = y.clone()
    host_scales = scales.tolist() if host else None
    lora_apply_planned(x, a, b, y, segments, scales, 16, host_scales=host_scales)
    want = expand_oracle(y_before, shrink_oracle(x, a, ids, ranks), b, ids, ranks, scales)
    base = ids < 0
    assert torch.equal(y[base], y_before[base]), "changed a row of a base-only token"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)


def test_apply_of_a_prefill_step_takes_the_shrink_buffer_way():
    gen = torch.Generator().manual_seed(2)
    slots, ranks = [0] * 40 + [1] * 40 + [-1] * 8, [8, 4]
    a = (torch.randn(2, 16, 48, generator=gen),)
    b = (torch.randn(2, 16, 24, generator=gen),)
    x, scales = torch.randn(len(slots), 48, generator=gen), torch.tensor([0.5, 2.0])
    ids, rk = torch.tensor(slots, dtype=torch.int32), torch.tensor(ranks, dtype=torch.int32)
    segments = build_segments(ids, rk, host=(slots, ranks))
    assert not segments.cpu_plan.all_padded  # runs in place: the unfused way
    y = torch.zeros(len(slots), 24)
    lora_apply_planned(x, a, b, y, segments, scales, 16)
    want = expand_oracle(
        torch.zeros(len(slots), 24), shrink_oracle(x, a, ids, rk), b, ids, rk, scales
    )
    torch.testing.assert_close(y.double(), want, atol=2e-4, rtol=2e-4)
