"""Table tests for build_segments: a pure function from per-token slots to segment metadata."""

import itertools
import re

import pytest
import torch

from kernels import build_segments

R16 = [16] * 4

CASES = [
    # slot per token, slot ranks -> token order, segment starts, segment slots
    ([-1, 0, 2, 1, 0], R16, [1, 4, 3, 2], [0, 2, 3, 4], [0, 1, 2]),
    ([-1, -1, -1], R16, [], [0], []),
    ([], R16, [], [0], []),
    ([3], R16, [0], [0, 1], [3]),
    ([2, 2, 2, 2], R16, [0, 1, 2, 3], [0, 4], [2]),
    ([3, 2, 1, 0], R16, [3, 2, 1, 0], [0, 1, 2, 3, 4], [0, 1, 2, 3]),
    ([1, -1, 1, -1, 1], R16, [0, 2, 4], [0, 3], [1]),
    # Ranks order first: slot 2 (rank 4) before slot 0 (rank 8) before slot 1 (rank 64).
    ([0, 1, 2, 0, 2], [8, 64, 4, 0], [2, 4, 0, 3, 1], [0, 2, 4, 5], [2, 0, 1]),
]


@pytest.mark.parametrize(("slots", "ranks", "order", "starts", "seg_slots"), CASES)
def test_table(slots, ranks, order, starts, seg_slots):
    seg = build_segments(torch.tensor(slots, dtype=torch.int32), torch.tensor(ranks))
    assert seg.token_order.tolist() == order
    assert seg.seg_starts.tolist() == starts
    assert seg.seg_slots.tolist() == seg_slots
    assert seg.seg_ranks.tolist() == [ranks[s] for s in seg_slots]
    assert seg.token_slots.tolist() == [slots[t] for t in order]
    assert seg.num_tokens == len(slots)
    assert seg.max_segment_len == max((b - a for a, b in itertools.pairwise(starts)), default=0)


def test_stable_within_segment():
    slots = torch.tensor([5, 1, 5, 1, 5] * 20)
    seg = build_segments(slots, torch.full((6,), 8))
    order = seg.token_order.tolist()
    ones = [t for t in order if slots[t] == 1]
    assert ones == sorted(ones)
    assert order[: len(ones)] == ones


BAD = [
    ([0, 4], [8] * 4, "slot_ids: slot 4 is out of range"),
    ([-2, 0], [8] * 4, "slot_ids: slot -2 is out of range"),
    ([[0, 1]], [8] * 4, "slot_ids: expected a 1-D tensor"),
    ([0.0, 1.0], [8] * 4, "slot_ids: expected an integer dtype"),
    ([0, 1], [8, 0], "slot 1 is used but slot_ranks[1] is 0"),
    ([0], [-1], "slot_ranks: ranks must be >= 0"),
]


@pytest.mark.parametrize(("slots", "ranks", "message"), BAD)
def test_bad_arguments(slots, ranks, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_segments(torch.tensor(slots), torch.tensor(ranks))


def test_not_a_tensor():
    with pytest.raises(ValueError, match=r"slot_ids: expected a torch\.Tensor"):
        build_segments([0, 1], torch.tensor([8, 8]))


def test_max_rank_is_the_largest_rank_in_use():
    seg = build_segments(torch.tensor([0, 2, -1]), torch.tensor([8, 64, 4]))
    assert seg.max_rank == 8 and seg.seg_ranks.tolist() == [4, 8]


@pytest.mark.parametrize("seed", range(20))
def test_host_lists_group_exactly_as_the_tensors(seed):
    """build_segments from the step's host lists equals the tensor path, field by field."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.randint(0, 4, (6,), generator=gen) * 8  # some slots empty (rank 0)
    usable = [s for s in range(6) if ranks[s] > 0] or [-1]
    picks = torch.randint(-1, len(usable), (int(torch.randint(0, 40, (1,), generator=gen)),),
                          generator=gen)  # fmt: skip
    slots = torch.tensor([usable[p] if p >= 0 else -1 for p in picks.tolist()], dtype=torch.int32)
    want = build_segments(slots, ranks)
    got = build_segments(slots, ranks, (slots.tolist(), ranks.tolist()))
    for field in ("token_order", "token_slots", "seg_starts", "seg_slots", "seg_ranks"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
        assert getattr(got, field).dtype == getattr(want, field).dtype, field
    assert (got.max_segment_len, got.max_rank) == (want.max_segment_len, want.max_rank)
    shape = lambda plan: [(g.rank, g.start, g.end, g.runs, g.padded is None, len(g.parts))  # noqa: E731
                          for g in plan.groups]  # fmt: skip
    assert shape(got.cpu_plan) == shape(want.cpu_plan)


@pytest.mark.parametrize(("slots", "ranks", "message"), BAD)
def test_bad_host_lists_are_refused_alike(slots, ranks, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_segments(torch.tensor(slots), torch.tensor(ranks), (slots, ranks))
