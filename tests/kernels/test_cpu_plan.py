"""Table tests for the CPU path's plan: which way each rank group runs, and its index tables."""

import pytest
import torch

from kernels import build_segments
from kernels.cpu_plan import MAX_PADDED_TOKENS, PART_TOKENS, Run


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def plan(slots, ranks):
    return build_segments(torch.tensor(slots), torch.tensor(ranks)).cpu_plan


def test_decode_groups_are_padded_per_rank():
    # slot ranks: 0 -> 8, 1 -> 64, 2 -> 4, 3 -> 8
    p = plan([0, 1, 2, 0, 2, 3, -1, 3], [8, 64, 4, 8])
    assert [(g.rank, g.start, g.end) for g in p.groups] == [(4, 0, 2), (8, 2, 6), (64, 6, 7)]
    padded = [(g.padded.first_slot, g.padded.end_slot, g.padded.bucket) for g in p.groups]
    assert padded == [(2, 3, 2), (0, 4, 2), (1, 2, 1)]
    # rank 8: slot 0's 2 tokens fill bucket 0, slot 3's fill bucket 3 (slots 1, 2: padding)
    assert p.groups[1].padded.positions.tolist() == [0, 1, 6, 7]


def test_bags_table():
    """Only the grouped ways expand through the bags; the padded ones expand by bmm."""
    # rank 3: slot 0 (padded); rank 2: slots 1 (5 tokens) and 3 (1), too uneven to pad
    p = plan([1, -1, 0, 1, 1, 3, 1, 1], [3, 2, 3, 2])
    assert [bool(g.parts) for g in p.groups] == [True, False]
    b = p.bags
    assert b.tokens.tolist() == [0, 3, 4, 6, 7, 5]
    assert b.offsets.tolist() == [0, 2, 4, 6, 8, 10]
    assert b.elem_token.tolist() == [0, 0, 3, 3, 4, 4, 6, 6, 7, 7, 5, 5]
    assert b.elem_slot.tolist() == [1] * 10 + [3, 3]
    assert b.elem_row.tolist() == [0, 1] * 6


def test_padded_rows_and_slots():
    p = plan([2, 0, 2, -1, 0], [4, 4, 4])
    (group,) = p.groups
    assert p.bags is None
    assert group.padded.rows.tolist() == [1, 4, 0, 2]  # sorted by slot, stable
    assert group.padded.slots == (0, 2)
    assert group.padded.row_slots.tolist() == [0, 0, 1, 1, 2, 2]  # slot of each padded row


def test_unbalanced_groups_take_grouped_parts():
    slots = [0] * 30 + [5]  # one slot far busier, six slots of range: 30 * 6 > 2 * 31
    (group,) = plan(slots, [4] * 6).groups
    assert group.padded is None and not group.in_place
    (part,) = group.parts
    assert (part.start, part.end, part.first_slot, part.end_slot) == (0, 31, 0, 6)
    assert part.offs.tolist() == [30, 30, 30, 30, 30, 31]


def test_parts_cut_inside_a_segment():
    n = MAX_PADDED_TOKENS + 1  # too many tokens to pad
    slots = [0] * (PART_TOKENS + 10) + [2] * (n - PART_TOKENS - 10)
    slots = slots[1:] + slots[:1]  # not runs of adjacent tokens
    (group,) = plan(slots, [4, 4, 4]).groups
    assert group.padded is None and not group.in_place
    cuts = [(p.start, p.end, p.first_slot, p.end_slot, p.offs.tolist()) for p in group.parts]
    assert cuts[0] == (0, 205, 0, 1, [205])
    assert cuts[1] == (205, 410, 0, 3, [61, 61, 205])  # slot 0's tokens end inside part 1
    assert sum(p.end - p.start for p in group.parts) == n
    for p in group.parts:
        assert p.offs[-1] == p.end - p.start


def test_long_runs_of_adjacent_tokens_run_in_place():
    """Prefill: each sequence's tokens are adjacent and share an adapter."""
    (group,) = plan([1] * 40 + [0] * 50 + [-1] * 7 + [1] * 33, [8, 8]).groups
    assert not group.in_place  # slot 1's tokens are two runs, not one
    p = plan([1] * 40 + [0] * 50 + [-1] * 7, [8, 8])
    assert p.groups[0].in_place and p.bags is None


def test_in_place_runs_are_chunked_and_dealt_to_threads(two_threads):
    slots = [2] * (PART_TOKENS + 44) + [0] * 100
    (group,) = plan(slots, [8, 8, 8]).groups
    # slot 0 (tokens 300..399) sorts first; slot 2's 300 tokens are cut at PART_TOKENS
    assert group.runs == (
        (Run(0, PART_TOKENS + 44, 100), Run(2, 0, PART_TOKENS)),
        (Run(2, PART_TOKENS, 44),),
    )


def test_short_in_place_work_stays_on_one_thread(two_threads):
    (group,) = plan([0] * 40 + [1] * 40, [8, 8]).groups
    assert group.runs == ((Run(0, 0, 40), Run(1, 40, 40)),)
