"""Runs one grid case through a shrink/expand pair and compares it with the float64 oracle."""

from __future__ import annotations

import torch

from kernels import build_segments
from kernels.lora_reference import expand_oracle, shrink_oracle
from tests.kernels.cases import TOLERANCE, Case, make_inputs

POISON = -7777.0


def check_shrink(case: Case, shrink, num_a_slices: int = 1) -> None:
    x, lora_a, _, _, slot_ids, ranks = make_inputs(case, num_a_slices)
    segments = build_segments(slot_ids, ranks)
    # Poisoned with a sentinel, distinct from the NaN padding a wrong read would bring in.
    out = torch.full((num_a_slices, case.num_tokens, case.max_rank), POISON)
    shrink(
        x, lora_a if num_a_slices > 1 else lora_a[0], out if num_a_slices > 1 else out[0], segments
    )
    want = shrink_oracle(x, lora_a, slot_ids, ranks)
    live = ~want.isnan()
    assert (out[~live] == POISON).all(), "wrote a row of a base-only token or a column past a rank"
    assert not (out[live] == POISON).any(), "left a live entry unwritten"
    atol, rtol = TOLERANCE[case.dtype]
    torch.testing.assert_close(out[live].double(), want[live], atol=atol, rtol=rtol)


def check_expand(case: Case, expand) -> None:
    _x, _, lora_b, scales, slot_ids, ranks = make_inputs(case)
    segments = build_segments(slot_ids, ranks)
    num_slices = len(case.widths)
    gen = torch.Generator().manual_seed(case.seed + 1)
    t = torch.randn(num_slices, case.num_tokens, case.max_rank, generator=gen)
    for tok, slot in enumerate(slot_ids.tolist()):  # past the rank, t is garbage: never read it
        t[:, tok, (ranks[slot] if slot >= 0 else 0) :] = torch.nan
    y = torch.randn(case.num_tokens, sum(case.widths), generator=gen).to(case.dtype)
    y_before = y.clone()
    expand(
        t if num_slices > 1 else t[0], lora_b if num_slices > 1 else lora_b[0], y, segments, scales
    )
    want = expand_oracle(y_before, t, lora_b, slot_ids, ranks, scales)
    base = slot_ids < 0
    assert torch.equal(y[base], y_before[base]), "changed a row of a base-only token"
    atol, rtol = TOLERANCE[case.dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)


def check_apply(case: Case, apply) -> None:
    """apply(x, lora_a, lora_b, y, segments, scales) adds each token's scaled shrink-expand
    to y, for a fused projection of one A slice per B slice."""
    x, lora_a, lora_b, scales, slot_ids, ranks = make_inputs(case, len(case.widths))
    segments = build_segments(slot_ids, ranks)
    gen = torch.Generator().manual_seed(case.seed + 2)
    y = torch.randn(case.num_tokens, sum(case.widths), generator=gen).to(case.dtype)
    y_before = y.clone()
    apply(x, lora_a, lora_b, y, segments, scales)
    t = shrink_oracle(x, lora_a, slot_ids, ranks)
    want = expand_oracle(y_before, t.nan_to_num(0.0), lora_b, slot_ids, ranks, scales)
    base = slot_ids < 0
    assert torch.equal(y[base], y_before[base]), "changed a row of a base-only token"
    atol, rtol = TOLERANCE[case.dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)
