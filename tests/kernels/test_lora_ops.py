"""lora_shrink / lora_expand through their dispatch point (the torch path on CPU) against the oracle."""

import pytest
import torch

from kernels import build_segments, lora_expand, lora_shrink
from tests.kernels.cases import sample_cases
from tests.kernels.checking import check_expand, check_shrink

CASES = sample_cases(
    72,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    tokens=(1, 7, 64, 300),
    hiddens=(33, 64, 257, 1024),
    rank_sets=(
        ((16,) * 4, 16),
        ((8, 3, 64, 16, 1, 33), 64),
        ((128,) * 3, 128),
        ((1,) * 5, 4),
        ((16,) * 64, 16),
    ),
    widths=(lambda h: (h,), lambda h: (h, h // 4 + 1, h // 4 + 1), lambda h: (2 * h + 3,)),
    seed=1234,
)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_shrink(case):
    check_shrink(case, lora_shrink)


@pytest.mark.parametrize("case", CASES[::3], ids=str)
def test_shrink_three_slices(case):
    check_shrink(case, lora_shrink, num_a_slices=3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_expand(case):
    check_expand(case, lora_expand)


def test_tens_of_thousands_of_tokens():
    from tests.kernels.cases import Case

    case = Case(torch.float32, 20_000, 64, (8, 4, 16, 8), 16, "zipf", (96,), seed=7)
    check_shrink(case, lora_shrink)
    check_expand(case, lora_expand)


def test_layer_matches_peft_formula():
    """shrink then expand is y + scale * x @ A.T @ B.T, the LoRA layer itself."""
    torch.manual_seed(0)
    x = torch.randn(5, 48, dtype=torch.float64).float()
    a = torch.randn(2, 8, 48) / 7
    b_peft = torch.randn(2, 40, 8)  # PEFT's lora_B.weight: [out, r]
    scales = torch.tensor([2.0, 0.5])
    slots = torch.tensor([1, 0, -1, 1, 0])
    seg = build_segments(slots, torch.tensor([8, 8]))
    t = lora_shrink(x, a, torch.empty(5, 8), seg)
    y = lora_expand(t, b_peft.transpose(1, 2).contiguous(), torch.zeros(5, 40), seg, scales)
    for tok, slot in enumerate(slots.tolist()):
        want = 0 if slot < 0 else scales[slot] * (x[tok] @ a[slot].T @ b_peft[slot].T)
        torch.testing.assert_close(
            y[tok], torch.as_tensor(want).expand(40).float(), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("widths", [(64,), (64, 17, 17)])
def test_prefill_runs_in_place(dtype, widths):
    """Adjacent runs of one adapter each (prefill) take the in-place path, with mixed ranks."""
    from tests.kernels.cases import Case, make_inputs

    case = Case(dtype, 300, 64, (8, 3, 16, 1, 12), 16, "runs", widths, seed=21)
    _, _, _, _, slot_ids, ranks = make_inputs(case)
    assert all(g.in_place for g in build_segments(slot_ids, ranks).cpu_plan.groups)
    check_shrink(case, lora_shrink)
    check_shrink(case, lora_shrink, num_a_slices=2)
    check_expand(case, lora_expand)


def test_grid_reaches_every_cpu_path():
    """The grid above runs every way of kernels/cpu_plan.py."""
    from tests.kernels.cases import make_inputs

    seen = set()
    for case in CASES:
        _, _, _, _, slot_ids, ranks = make_inputs(case)
        for g in build_segments(slot_ids, ranks).cpu_plan.groups:
            if g.padded:
                seen.add("dense padded" if g.padded.dense else "padded")
            else:
                seen.add("in place" if g.in_place else "grouped")
    assert seen == {"in place", "dense padded", "padded", "grouped"}


def test_threaded_parts_under_inference_mode():
    """The CPU threads write into tensors made under torch.inference_mode (the engine's)."""
    from tests.kernels.cases import Case, make_inputs

    case = Case(torch.float32, 600, 64, (8, 16), 16, "runs", (64,), seed=3)
    x, lora_a, lora_b, scales, slot_ids, ranks = make_inputs(case)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            seg = build_segments(slot_ids, ranks)
            assert any(len(g.runs) > 1 for g in seg.cpu_plan.groups)  # work for two threads
            t = lora_shrink(x, lora_a[0], torch.zeros(600, 16), seg)
            y = lora_expand(t, lora_b[0], torch.zeros(600, 64), seg, scales)
    finally:
        torch.set_num_threads(before)
    assert torch.isfinite(y).all() and y.abs().sum() > 0
