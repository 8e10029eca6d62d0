"""Per-module ranks in one slot (rank_pattern): each fused slice multiplies only its own
module's rank, against the float64 oracle, on the CPU path and in the Triton kernels (the
interpreter without a GPU), and the Triton shrink leaves the columns past it unwritten."""

import pytest
import torch

from kernels import build_segments
from kernels.lora_expand_triton import lora_expand_triton
from kernels.lora_ops import lora_expand, lora_shrink
from kernels.lora_shrink_triton import lora_shrink_parts, lora_shrink_triton

SLOT_RANKS = torch.tensor([8, 16, 4, 0], dtype=torch.int32)  # slot 3 is empty
# [slices, slots]: each module's own rank, at most its slot's; 0 = the adapter leaves it out
SLICE_RANKS = torch.tensor([[8, 2, 4, 0], [3, 16, 0, 0], [0, 7, 1, 0]], dtype=torch.int32)
HIDDEN, WIDTHS, MAX_RANK = 100, (20, 8, 8), 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU


def world(dtype, seed=0):
    """x, A and B stacks zero past each module's rank (as the slab keeps them), slots, scales."""
    gen = torch.Generator().manual_seed(seed)
    tokens = 11
    slots = torch.tensor([0, 1, -1, 2, 1, 0, 0, 2, -1, 1, 1], dtype=torch.int32)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(dtype)
    a, b = [], []
    for s, width in enumerate(WIDTHS):
        a_s = torch.randn(4, MAX_RANK, HIDDEN, generator=gen) * 0.3
        b_s = torch.randn(4, MAX_RANK, width, generator=gen) * 0.3
        for slot in range(4):
            a_s[slot, SLICE_RANKS[s, slot] :] = 0
            b_s[slot, SLICE_RANKS[s, slot] :] = 0
        a.append(a_s.to(dtype))
        b.append(b_s.to(dtype))
    scales = torch.tensor([0.5, 2.0, 1.5, 0.0])
    y = torch.randn(tokens, sum(WIDTHS), generator=gen).to(dtype)
    return x, a, b, slots, scales, y


def oracle(x, a, b, slots, scales, y):
    """y + scale * (x A_s[:rank_s].T) B_s[:rank_s], per token and slice, in float64."""
    out = y.double().clone()
    col = 0
    for s, width in enumerate(WIDTHS):
        for t, slot in enumerate(slots.tolist()):
            if slot < 0:
                continue
            r = int(SLICE_RANKS[s, slot])
            lo = x[t].double() @ a[s][slot, :r].double().T
            out[t, col : col + width] += scales[slot].double() * (lo @ b[s][slot, :r].double())
        col += width
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_ranks", [True, False], ids=["slice ranks", "slot ranks"])
def test_cpu_path_matches_the_oracle(dtype, with_ranks):
    x, a, b, slots, scales, y = world(dtype)
    segments = build_segments(slots, SLOT_RANKS)
    t = torch.empty(len(WIDTHS), x.shape[0], MAX_RANK)
    ranks = SLICE_RANKS if with_ranks else None
    lora_shrink(x, a, t, segments, ranks)
    got = lora_expand(t, b, y.clone(), segments, scales, ranks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), oracle(x, a, b, slots, scales, y), rtol=tol, atol=tol)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_kernels_stop_at_each_slices_rank(dtype, num_splits):
    x, a, b, slots, scales, y = world(dtype, seed=1)
    segments = build_segments(slots.to(DEVICE), SLOT_RANKS.to(DEVICE))
    ranks = SLICE_RANKS.to(DEVICE)
    t = torch.full((len(WIDTHS), x.shape[0], MAX_RANK), float("nan"), device=DEVICE)
    a_dev = tuple(t_.to(DEVICE) for t_ in a)
    lora_shrink_triton(x.to(DEVICE), a_dev, t, segments, ranks, num_splits=num_splits)
    t = t.cpu()
    for s in range(len(WIDTHS)):
        for tok, slot in enumerate(slots.tolist()):
            if slot >= 0:  # written up to the slice's own rank, never past it
                r = int(SLICE_RANKS[s, slot])
                assert not t[s, tok, :r].isnan().any()
                assert t[s, tok, r:].isnan().all()
    got = y.clone().to(DEVICE)
    b_dev = tuple(t_.to(DEVICE) for t_ in b)
    lora_expand_triton(t.to(DEVICE), b_dev, got, segments, scales.to(DEVICE), ranks)
    got = got.cpu()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), oracle(x, a, b, slots, scales, y), rtol=tol, atol=tol)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split-k"])
def test_the_split_parts_added_up_by_the_expand_stop_at_each_slices_rank(num_splits):
    """The layer path (lora_shrink_parts, then the expand adding them up) with rank_pattern
    ranks: every part past a slice's rank, and every base-only row, is made NaN before the
    expand, which must not read them."""
    x, a, b, slots, scales, y = world(torch.float32, seed=2)
    segments = build_segments(slots.to(DEVICE), SLOT_RANKS.to(DEVICE))
    ranks = SLICE_RANKS.to(DEVICE)
    parts = lora_shrink_parts(x.to(DEVICE), tuple(t_.to(DEVICE) for t_ in a), segments, ranks,
                              num_splits=num_splits).cpu()  # fmt: skip
    assert (parts.shape[0] > 1) == (num_splits > 1)  # hidden split, the last part short
    for s in range(len(WIDTHS)):
        for tok, slot in enumerate(slots.tolist()):
            r = int(SLICE_RANKS[s, slot]) if slot >= 0 else 0
            parts[:, s, tok, r:] = float("nan")
    got = y.clone().to(DEVICE)
    lora_expand_triton(parts.to(DEVICE), tuple(t_.to(DEVICE) for t_ in b), got, segments,
                       scales.to(DEVICE), ranks)  # fmt: skip
    torch.testing.assert_close(got.cpu().double(), oracle(x, a, b, slots, scales, y),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_a_bad_table_is_refused():
    x, a, b, slots, scales, y = world(torch.float32)
    segments = build_segments(slots, SLOT_RANKS)
    t = torch.empty(len(WIDTHS), x.shape[0], MAX_RANK)
    with pytest.raises(ValueError, match="slice_ranks: expected dtype in"):
        lora_shrink(x, a, t, segments, SLICE_RANKS.long())
    with pytest.raises(ValueError, match=r"slice_ranks: expected shape \(3, 4\)"):
        lora_expand(t, b, y, segments, scales, SLICE_RANKS[:2])
