"""lora_bias_add and dora_rescale against a float64 oracle of plain loops: every dtype, one
stack or fused slices, with and without the base bias; rows outside `rows` stay bit-identical."""

import pytest
import torch

from kernels import dora_rescale, lora_bias_add
from tests.kernels.cases import TOLERANCE

NUM_TOKENS, NUM_SLOTS = 11, 5
WIDTHS = {"single": (24,), "fused": (16, 8, 8)}  # e.g. q|k|v: slices of unequal width
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def bias_oracle(y, biases, rows, slots):
    """y + biases[s][slot] on each listed row's slice s, element by element in float64."""
    out = y.double().clone()
    for t, slot in zip(rows.tolist(), slots.tolist()):
        col = 0
        for b in biases:
            for j in range(b.shape[1]):
                out[t, col + j] += float(b[slot, j])
            col += b.shape[1]
    return out


def dora_oracle(y, scales, rows, slots, base_bias):
    """g * (y - b) + b on each listed row, g = scales[s][slot] on slice s, in float64."""
    out = y.double().clone()
    for t, slot in zip(rows.tolist(), slots.tolist()):
        col = 0
        for g in scales:
            for j in range(g.shape[1]):
                b = 0.0 if base_bias is None else float(base_bias[col + j])
                out[t, col + j] = float(g[slot, j]) * (float(y[t, col + j]) - b) + b
            col += g.shape[1]
    return out


def inputs(dtype, widths, seed=0):
    """y [tokens, width]; a table per slice [slots, w]; rows: a shuffled strict subset of the
    tokens (not sorted, one slot repeated), with their slots."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(NUM_TOKENS, sum(widths), generator=gen).to(dtype)
    tables = [(torch.randn(NUM_SLOTS, w, generator=gen) * 0.5 + 1).to(dtype) for w in widths]
    rows = torch.tensor([7, 0, 3, 9, 4], dtype=torch.int64)
    slots = torch.tensor([2, 4, 2, 0, 1], dtype=torch.int64)
    base_bias = torch.randn(sum(widths), generator=gen).to(dtype)
    return y, tables, rows, slots, base_bias


def untouched(rows):
    keep = torch.ones(NUM_TOKENS, dtype=torch.bool)
    keep[rows] = False
    return keep


def tolerance(dtype):
    atol, rtol = TOLERANCE[dtype]
    return {"atol": atol, "rtol": rtol}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("stack", WIDTHS)
def test_bias_add_matches_the_oracle(dtype, stack):
    y, tables, rows, slots, _ = inputs(dtype, WIDTHS[stack])
    before = y.clone()
    want = bias_oracle(before, tables, rows, slots)
    assert lora_bias_add(y, tables, rows, slots) is y  # in place
    keep = untouched(rows)
    assert torch.equal(y[keep], before[keep]), "changed a row outside `rows`"
    torch.testing.assert_close(y.double(), want, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("stack", WIDTHS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-base-bias", "base-bias"])
def test_dora_rescale_matches_the_oracle(dtype, stack, with_bias):
    y, tables, rows, slots, base_bias = inputs(dtype, WIDTHS[stack], seed=1)
    base_bias = base_bias if with_bias else None
    before = y.clone()
    want = dora_oracle(before, tables, rows, slots, base_bias)
    assert dora_rescale(y, tables, rows, slots, base_bias) is y
    keep = untouched(rows)
    assert torch.equal(y[keep], before[keep]), "changed a row outside `rows`"
    torch.testing.assert_close(y.double(), want, **tolerance(dtype))


def test_float32_tables_on_half_outputs():
    # The slab may hold its vectors in float32 beside a float16 model: cast, not refused.
    y, tables, rows, slots, base_bias = inputs(torch.float16, WIDTHS["fused"], seed=2)
    tables = [t.float() for t in tables]
    before = y.clone()
    dora_rescale(y, tables, rows, slots, base_bias.float())
    want = dora_oracle(before, tables, rows, slots, base_bias)
    torch.testing.assert_close(y.double(), want, **tolerance(torch.float16))


def test_a_scale_of_one_and_a_zero_bias_change_nothing():
    # What a slot without DoRA or lora_bias holds: the ops must be exact no-ops on its rows.
    y, tables, rows, slots, _ = inputs(torch.float32, WIDTHS["fused"], seed=3)
    before = y.clone()
    dora_rescale(y, [torch.ones_like(t) for t in tables], rows, slots, None)
    lora_bias_add(y, [torch.zeros_like(t) for t in tables], rows, slots)
    assert torch.equal(y, before)


def test_no_rows_is_a_no_op():
    y, tables, _, _, base_bias = inputs(torch.float32, WIDTHS["single"])
    before = y.clone()
    none = torch.zeros(0, dtype=torch.int64)
    lora_bias_add(y, tables, none, none)
    dora_rescale(y, tables, none, none, base_bias)
    assert torch.equal(y, before)


@pytest.mark.parametrize("op", [lora_bias_add, dora_rescale], ids=["bias", "dora"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda y, t, r, s: (y[None], t, r, s), r"y: expected \[num_tokens, width\]"),
        (lambda y, t, r, s: (y[:, :-1], t, r, s), r"slices cover 32 columns, y has 31"),
        (lambda y, t, r, s: (y, t[:2], r, s), r"slices cover 24 columns, y has 32"),
        (lambda y, t, r, s: (y, t, r, s[:-1]), r"rows \(5,\) and slots \(4,\) must be \[n\]"),
        (lambda y, t, r, s: (y, t, r[None], s[None]), r"must be \[n\]"),
    ],
    ids=["y-3d", "y-narrow", "slices-narrow", "slots-short", "rows-2d"],
)
def test_shape_errors_name_what_is_wrong(op, change, message):
    y, tables, rows, slots, _ = inputs(torch.float32, WIDTHS["fused"])
    name = "biases" if op is lora_bias_add else "scales"
    with pytest.raises(ValueError, match=message.replace("slices", f"{name}: slices")):
        op(*change(y, tables, rows, slots))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dora_rescale_of_every_row_in_any_order(dtype):
    # Every token DoRA: rescaled in place without a gather, each row by its own slot.
    y, tables, _, _, base_bias = inputs(dtype, WIDTHS["fused"], seed=4)
    rows = torch.randperm(NUM_TOKENS, generator=torch.Generator().manual_seed(5))
    slots = torch.arange(NUM_TOKENS) % NUM_SLOTS
    want = dora_oracle(y.clone(), tables, rows, slots, base_bias)
    dora_rescale(y, tables, rows, slots, base_bias)
    torch.testing.assert_close(y.double(), want, **tolerance(dtype))
