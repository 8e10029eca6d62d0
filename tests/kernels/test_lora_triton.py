"""The Triton LoRA kernels against the float64 oracle.

Without a GPU they run in the Triton interpreter (set in conftest), in fp32
and fp16 only: the interpreter's tl.dot is wrong for bf16. Sizes stay small
because every program instance runs in Python there.
"""

import dataclasses
from functools import partial

import pytest
import torch

from kernels import build_segments
from kernels.lora_expand_triton import lora_expand_triton
from kernels.lora_ops import lora_apply_planned, lora_expand, lora_shrink
from kernels.lora_shrink_triton import lora_shrink_parts, lora_shrink_triton
from kernels.lora_tuning import ExpandConfig, ShrinkConfig
from tests.kernels.cases import Case, sample_cases
from tests.kernels.checking import check_apply, check_expand, check_shrink

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

CASES = sample_cases(
    40,
    dtypes=(torch.float32, torch.float16),
    tokens=(1, 7, 40),
    hiddens=(16, 33, 70, 130),
    rank_sets=(
        ((16,) * 3, 16),
        ((8, 3, 32, 1), 32),
        ((128,) * 2, 128),
    ),
    widths=(lambda h: (h,), lambda h: (h, h // 4 + 1, h // 4 + 1)),
    seed=99,
)


def _on_device(segments):
    """The same segments with their tensors on DEVICE (the launchers read them there)."""
    fields = ("token_order", "token_slots", "seg_starts", "seg_slots", "seg_ranks")
    moved = {f: getattr(segments, f).to(DEVICE) for f in fields}
    return dataclasses.replace(segments, **moved, cpu_plan=None)


def _stacks(stacks):
    return tuple(s.to(DEVICE) for s in (stacks if isinstance(stacks, list) else [stacks]))


def _triton_shrink(x, lora_a, out, segments, num_splits=None, config=None):
    """The launcher on DEVICE (the interpreter without CUDA); the result lands in `out`."""
    out3 = (out if out.dim() == 3 else out.unsqueeze(0)).to(DEVICE)
    lora_shrink_triton(x.to(DEVICE), _stacks(lora_a), out3, _on_device(segments),
                       num_splits=num_splits, config=config)  # fmt: skip
    out.copy_(out3.view(out.shape).cpu())


def _triton_expand(t, lora_b, y, segments, scales):
    t3 = (t if t.dim() == 3 else t.unsqueeze(0)).to(DEVICE)
    y_dev = y.to(DEVICE)
    lora_expand_triton(t3, _stacks(lora_b), y_dev, _on_device(segments), scales.to(DEVICE))
    y.copy_(y_dev.cpu())


@pytest.mark.parametrize("case", CASES, ids=str)
def test_shrink(case):
    check_shrink(case, _triton_shrink)


def test_shrink_three_slices():
    case = Case(torch.float32, 9, 40, (8, 16, 5), 16, "uniform", (40,), seed=5)
    check_shrink(case, _triton_shrink, num_a_slices=3)


@pytest.mark.parametrize("num_splits", [2, 3])
@pytest.mark.parametrize(
    "case",
    [
        Case(torch.float32, 7, 130, (16, 3, 9), 16, "uniform", (130,), seed=21),
        Case(torch.float16, 40, 200, (8, 3, 32, 1), 32, "skewed", (200,), seed=22),
    ],
    ids=str,
)
def test_shrink_split_k(case, num_splits):
    """hidden summed in parts (the last one short), the parts added by a second kernel: the
    oracle's result, and base-only rows and columns past a rank still untouched."""
    check_shrink(case, partial(_triton_shrink, num_splits=num_splits))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_shrink_with_rows_capped_at_16(num_splits):
    """A tuned cap of 16 rows per program: a 30-token segment spans two m-blocks."""
    case = Case(torch.float32, 40, 130, (16, 8), 16, "skewed", (130,), seed=44)
    config = ShrinkConfig(block_m=16)
    check_shrink(case, partial(_triton_shrink, num_splits=num_splits, config=config))


def test_shrink_three_slices_split_k():
    case = Case(torch.float32, 9, 140, (8, 16, 5), 16, "uniform", (140,), seed=23)
    check_shrink(case, partial(_triton_shrink, num_splits=3), num_a_slices=3)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(
    "case",
    [
        Case(torch.float32, 9, 140, (8, 16, 5), 16, "uniform", (140, 36, 36), seed=31),
        Case(torch.float16, 40, 260, (8, 3, 32, 1), 32, "skewed", (70,), seed=32),
    ],
    ids=str,
)
def test_apply_adds_up_the_split_parts_in_the_expand(case, num_splits):
    """A LoRA layer's path: the shrink leaves its split-K parts (the last one short) and the
    expand adds them up as it loads them; the oracle's result, base-only rows untouched."""

    def apply(x, lora_a, lora_b, y, segments, scales):
        seg = _on_device(segments)
        parts = lora_shrink_parts(x.to(DEVICE), _stacks(lora_a), seg, num_splits=num_splits)
        assert parts.shape == (num_splits, len(lora_a), case.num_tokens, case.max_rank)
        y_dev = y.to(DEVICE)
        lora_expand_triton(parts, _stacks(lora_b), y_dev, seg, scales.to(DEVICE))
        y.copy_(y_dev.cpu())

    check_apply(case, apply)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_expand(case):
    check_expand(case, _triton_expand)


@pytest.mark.parametrize(
    "config",
    [
        ExpandConfig(block_n=16, n_chunks=3),
        ExpandConfig(block_n=32, n_chunks=2, block_m=16),
    ],
    ids=str,
)
@pytest.mark.parametrize(
    "case",
    [
        Case(torch.float32, 9, 40, (8, 16, 5), 16, "uniform", (70, 23, 23), seed=41),
        Case(torch.float16, 7, 24, (128, 100), 128, "skewed", (50,), seed=42),
        Case(torch.float32, 40, 24, (16, 8), 16, "skewed", (40,), seed=43),
    ],
    ids=str,
)
def test_expand_in_column_groups(case, config):
    """A program writing several blocks of columns in turn (the last group partly past the
    slice's width), with ranks in one k tile and with a loop over the rank; with 16-row
    tiles, a segment longer than 16 tokens spans several programs."""

    def expand(t, lora_b, y, segments, scales):
        t3 = (t if t.dim() == 3 else t.unsqueeze(0)).to(DEVICE)
        y_dev = y.to(DEVICE)
        lora_expand_triton(t3, _stacks(lora_b), y_dev, _on_device(segments), scales.to(DEVICE),
                           config=config)  # fmt: skip
        y.copy_(y_dev.cpu())

    check_expand(case, expand)


@pytest.mark.slow
def test_longer_segments():
    """Segments longer than the largest BLOCK_M (64) span several m-blocks."""
    case = Case(torch.float32, 150, 24, (16, 8), 16, "skewed", (24, 9), seed=11)
    check_shrink(case, _triton_shrink)
    check_expand(case, _triton_expand)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dispatch_on_cuda_matches_cpu(dtype):
    """On CUDA the dispatch point runs Triton; it agrees with the torch path on the CPU."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 512, generator=gen).to(dtype)
    a = (torch.randn(8, 32, 512, generator=gen) / 20).to(dtype)
    b = (torch.randn(8, 32, 640, generator=gen) / 5).to(dtype)
    slots = torch.randint(-1, 8, (300,), generator=gen)
    ranks = torch.tensor([32, 16, 8, 4, 32, 1, 24, 16], dtype=torch.int32)
    scales = torch.rand(8, generator=gen)
    results = []
    for device in ("cpu", "cuda"):
        seg = build_segments(slots.to(device), ranks.to(device))
        t = lora_shrink(x.to(device), a.to(device), torch.zeros(300, 32, device=device), seg)
        y = lora_expand(
            t,
            b.to(device),
            torch.zeros(300, 640, dtype=dtype, device=device),
            seg,
            scales.to(device),
        )
        results.append(y.cpu().double())
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(results[1], results[0], atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [32, 300])
def test_apply_on_cuda_equals_shrink_then_expand_bit_for_bit(tokens):
    """The layer path (split parts added up by the expand) against the two public ops (added
    up by the shrink's sum kernel): the same sums in the same order, so equal bits."""
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=gen).to(torch.bfloat16).cuda()
    a = [(torch.randn(8, 16, 2048, generator=gen) / 40).to(torch.bfloat16).cuda() for _ in "qkv"]
    b = [(torch.randn(8, 16, w, generator=gen) / 4).to(torch.bfloat16).cuda()
         for w in (2048, 512, 512)]  # fmt: skip
    slots = torch.randint(-1, 8, (tokens,), generator=gen).to(torch.int32).cuda()
    seg = build_segments(slots, torch.full((8,), 16, dtype=torch.int32, device="cuda"))
    scales = torch.rand(8, generator=gen).cuda()
    y0 = torch.randn(tokens, 3072, generator=gen).to(torch.bfloat16).cuda()
    fused = y0.clone()
    lora_apply_planned(x, tuple(a), tuple(b), fused, seg, scales, 16)
    t = lora_shrink(x, a, torch.zeros(3, tokens, 16, device="cuda"), seg)
    two = lora_expand(t, b, y0.clone(), seg, scales)
    assert torch.equal(fused, two)
    assert not torch.equal(fused, y0)


@pytest.mark.parametrize("layout", ["transposed", "inside a wider buffer"])
def test_shrink_split_k_into_a_strided_out(layout):
    """Split-K sums its parts in a scratch buffer of its own strides and stores them into
    out by out's: a transposed out, or one a view inside a wider buffer whose margins must
    stay as they were."""
    case = Case(torch.float32, 9, 140, (8, 16, 5), 16, "uniform", (140,), seed=24)
    margins = []

    def shrink(x, lora_a, out, segments):
        out3 = out if out.dim() == 3 else out.unsqueeze(0)
        slices, tokens, rank = out3.shape
        if layout == "transposed":
            buf = torch.empty(slices, rank, tokens, device=DEVICE).transpose(1, 2)
        else:
            wide = torch.full((slices, tokens, rank + 6), 7.0, device=DEVICE)
            buf = wide[:, :, 3 : 3 + rank]
            margins.append(wide)
        buf.copy_(out3)
        lora_shrink_triton(x.to(DEVICE), _stacks(lora_a), buf, _on_device(segments), num_splits=3)
        out3.copy_(buf.cpu())

    check_shrink(case, shrink, num_a_slices=3)
    for wide in margins:
        assert (wide[:, :, :3] == 7.0).all() and (wide[:, :, -3:] == 7.0).all()
