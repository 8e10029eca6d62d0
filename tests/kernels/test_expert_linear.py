"""expert_linear and group_routes against a float64 oracle (tests/kernels/expert_cases.py).

Both backends: the torch path (the dispatch point on CPU, float32 and bfloat16) and the Triton
kernel (in the interpreter without a GPU, set in conftest: float32 and float16 only, as its
tl.dot is wrong for bf16; small sizes, as every program runs in Python there). The LoRA stacks
are paged, overlapping views with NaN in every row no adapter holds.
"""

from __future__ import annotations

import re
from functools import partial

import pytest
import torch

from kernels import expert_linear, group_routes, route_groups
from kernels.expert_groups import make_groups
from kernels.expert_linear_triton import expert_linear_triton
from kernels.fp8 import quantize_fp8
from tests.kernels.cases import TOLERANCE
from tests.kernels.expert_cases import (
    IN,
    MAX_RANK,
    NUM_EXPERTS,
    NUM_PAGES,
    PAGE_RANK,
    SLOT_RANKS,
    Problem,
    moved,
    oracle,
    paged_stacks,
    problem,
)

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def run_torch(x, weight, w_scale, lora_a, lora_b, scales, groups):
    """The dispatch point (the torch path on CPU), every argument checked."""
    return expert_linear(x, weight, w_scale, lora_a, lora_b, scales, groups, checked=True)


def run_triton(x, weight, w_scale, lora_a, lora_b, scales, groups, block=None):
    """The kernel on DEVICE; block: its column and K tiles (None: the launcher's)."""
    on = partial(moved, device=DEVICE)
    stacks = lambda s: None if s is None else tuple(map(on, s))  # noqa: E731
    y = expert_linear_triton(on(x), on(weight), on(w_scale), stacks(lora_a), stacks(lora_b),
                             on(scales), groups, block_n=block, block_k=block)  # fmt: skip
    return y.cpu()


# triton16: 16-wide column and K tiles, several of each, the last ones partly past a slice's
# width and past `in` (the launcher's own tiles cover these sizes whole).
BACKENDS = {"torch": run_torch, "triton": run_triton, "triton16": partial(run_triton, block=16)}
ON = {"torch": "cpu", "triton": DEVICE, "triton16": DEVICE}  # where each backend's groups live
PATHS = ("torch", "triton")


def check(p: Problem, backend, groups=None, order=None, x_sorted=None) -> torch.Tensor:
    """Sort the rows, run the backend and compare, row by unsorted row, with the oracle."""
    if groups is None:
        order, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, ON[backend])
    order = order.cpu()
    xs = p.x[order] if x_sorted is None else x_sorted
    y = BACKENDS[backend](xs, p.weight, p.w_scale, p.lora_a, p.lora_b, p.scales, groups)
    assert y.shape == (p.x.shape[0], p.w_ref.shape[1]) and y.dtype == p.x.dtype
    atol, rtol = TOLERANCE[p.x.dtype]
    torch.testing.assert_close(y.double(), oracle(p)[order], atol=atol, rtol=rtol)
    return y


GPU = pytest.mark.gpu
BACKEND_DTYPES = [("torch", torch.float32), ("torch", torch.bfloat16), ("triton16", torch.float32),
                  ("triton16", torch.float16), pytest.param("triton16", torch.bfloat16, marks=GPU)]  # fmt: skip


@pytest.mark.parametrize("widths", [(20, 12), (24,)], ids=["gate_up", "one_slice"])
@pytest.mark.parametrize(("backend", "dtype"), BACKEND_DTYPES, ids=str)
def test_experts_slots_and_ranks(backend, dtype, widths):
    """3 experts x slots -1, 0, 1, 4, 6 of ranks 3, 8, 5, 2 in a max_rank-8 paged stack, 37 rows
    (not a multiple of the 16-row tile), fused gate|up and a single slice."""
    check(problem(widths=widths, dtype=dtype, seed=len(widths)), backend)


@pytest.mark.parametrize("backend", PATHS)
def test_a_group_spanning_several_tiles(backend):
    """Most rows in (expert 0, slot 1): one group of 36 rows, three tiles, the last partial."""
    p = problem(num_rows=47, skewed=True, seed=3)
    _, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, "cpu")
    assert max(groups.host_lengths) > 2 * groups.block_m
    check(p, backend)


@pytest.mark.parametrize("backend", PATHS)
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "base_only"])
def test_fp8_weight(backend, lora):
    """An FP8 weight with per-(expert, output) scales, against the dequantized weight."""
    check(problem(num_rows=20, fp8=True, lora=lora, seed=4), backend)


@pytest.mark.parametrize("backend", PATHS)
def test_without_lora(backend):
    """lora_a, lora_b, scales None: every row gets its expert's base output alone."""
    check(problem(num_rows=20, lora=False, seed=5), backend)


@pytest.mark.parametrize("backend", PATHS)
def test_no_rows(backend):
    """N = 0: no groups, no tiles, no launch; an empty [0, out] output."""
    p = problem(num_rows=0, seed=6)
    order, groups = group_routes([], [], SLOT_RANKS, ON[backend])
    assert order.numel() == 0 and groups.num_groups == 0 and groups.num_tiles == 0
    y = check(p, backend)
    assert y.shape == (0, 32)


@pytest.mark.parametrize("backend", PATHS)
def test_empty_groups(backend):
    """Groups of no rows (first, between two, last) get no tile and change nothing."""
    p = problem(num_rows=20, seed=7)
    order, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, ON[backend])
    host = [list(v) for v in (groups.host_experts, groups.host_slots, groups.host_starts,
                              groups.host_lengths, groups.host_ranks)]  # fmt: skip
    for at in (0, 2, len(host[0])):
        end = host[2][at - 1] + host[3][at - 1] if at else 0
        for values, v in zip(host, (2, 1, end, 0, SLOT_RANKS[1])):
            values.insert(at, v)
    padded = make_groups(*host, p.x.shape[0], ON[backend])
    assert padded.num_tiles == groups.num_tiles and padded.num_groups == groups.num_groups + 3
    check(p, backend, padded, order)


@pytest.mark.parametrize("backend", PATHS)
def test_x_as_a_strided_view(backend):
    """x a view with a row stride past its width: read by its strides."""
    p = problem(num_rows=12, seed=8)
    order, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, ON[backend])
    wide = torch.full((p.x.shape[0], IN + 10), torch.nan)
    wide[:, 4 : 4 + IN] = p.x[order.cpu()]
    check(p, backend, groups, order, wide[:, 4 : 4 + IN])


def test_group_routes_worked_example():
    """kernels/expert_groups.py's docstring example, and stable order within a group."""
    order, g = group_routes([1, 0, 1, 0, 1, 0], [0, -1, 0, 2, -1, -1], [8, 4, 16], "cpu")
    assert order.dtype == torch.int64 and order.tolist() == [1, 5, 3, 4, 0, 2]
    assert (g.host_experts, g.host_slots) == ((0, 0, 1, 1), (-1, 2, -1, 0))
    assert (g.host_starts, g.host_lengths, g.host_ranks) == (
        (0, 2, 3, 4),
        (2, 1, 1, 2),
        (0, 16, 0, 8),
    )
    for name in ("experts", "slots", "starts", "lengths", "ranks"):
        tensor = getattr(g, name)
        assert tensor.dtype == torch.int32 and tensor.tolist() == list(getattr(g, f"host_{name}"))
    assert g.tile_groups.tolist() == [0, 1, 2, 3] and g.tile_rows.tolist() == [0, 2, 3, 4]
    _, long = group_routes([2] * 40, [1] * 40, [0, 4], "cpu", block_m=16)
    assert long.tile_groups.tolist() == [0, 0, 0] and long.tile_rows.tolist() == [0, 16, 32]
    assert long.max_rank == 4


def test_route_groups_on_the_device_groups_as_the_host_does():
    """The same order and groups from device tensors, a rank-0 slot grouped as base only."""
    gen = torch.Generator().manual_seed(11)
    experts = torch.randint(0, 5, (97,), generator=gen)
    slots = torch.randint(-1, 4, (97,), generator=gen, dtype=torch.int32)
    ranks = [8, 4, 16, 2]
    order, g = route_groups(experts, slots, ranks)
    want_order, want = group_routes(experts.tolist(), slots.tolist(), ranks, "cpu")
    assert order.tolist() == want_order.tolist()
    for name in ("experts", "slots", "starts", "lengths", "ranks", "tile_groups", "tile_rows"):
        assert getattr(g, name).tolist() == getattr(want, name).tolist(), name
    _, g = route_groups(experts, slots, [8, 0, 16, 2])  # slot 1 adds nothing in this layer
    assert 1 not in g.host_slots and all(r == 0 for s, r in zip(g.host_slots, g.host_ranks)
                                         if s < 0)  # fmt: skip
    order, g = route_groups(experts, None, ())  # no adapter: one group per expert
    assert g.host_slots == (-1,) * len(set(experts.tolist())) and g.max_rank == 0


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (([0, 1], [0], [4]), "slots"),
        (([0, -1], [0, 0], [4]), "expert_ids"),
        (([0, 1], [0, 1], [4]), "slots"),
        (([0, 1], [0, -2], [4]), "slots"),
        (([0], [0], [-1]), "slot_ranks"),
    ],
)
def test_group_routes_rejects(args, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        group_routes(*args, "cpu")


@pytest.mark.parametrize("block_m", [8, 24])
def test_tiles_are_a_power_of_two_of_at_least_16_rows(block_m):
    with pytest.raises(ValueError, match=r"^block_m:"):
        group_routes([0], [0], [4], "cpu", block_m=block_m)


def _fp8_without_scale(kw):
    kw["weight"] = quantize_fp8(kw["weight"][0])[0][None].expand(NUM_EXPERTS, -1, -1)


def _repage(kw):  # slice 1's slots two pages apart, slice 0's one
    a = kw["lora_a"][1]
    wider = torch.zeros(a.shape[0], 100, IN).as_strided(
        a.shape, (100 * IN, 2 * PAGE_RANK * IN, IN, 1)
    )
    kw["lora_a"] = (kw["lora_a"][0], wider)


def _narrow_b(kw):
    narrow = paged_stacks(11, MAX_RANK, torch.Generator().manual_seed(0), torch.float32)
    kw["lora_b"] = (kw["lora_b"][0], narrow)


def _routes(expert_ids=None, slots=None, ranks=SLOT_RANKS):
    def change(kw):
        p = problem(seed=9)
        kw["groups"] = group_routes(expert_ids or p.expert_ids, slots or p.slots, ranks, "cpu")[1]

    return change


BAD = [  # (id, the argument the error names, the change)
    ("x_int", "x", lambda kw: kw.update(x=kw["x"].to(torch.int32))),
    ("weight_in", "weight", lambda kw: kw.update(weight=kw["weight"][:, :, :-1])),
    ("fp8_without_scale", "w_scale", _fp8_without_scale),
    ("scale_without_fp8", "w_scale", lambda kw: kw.update(w_scale=torch.ones(NUM_EXPERTS, 32))),
    ("a_slices_paged_apart", "lora_a[1]", _repage),
    ("a_experts", "lora_a[0]", lambda kw: kw.update(lora_a=(kw["lora_a"][0][:2], kw["lora_a"][1]))),
    ("b_none", "lora_b", lambda kw: kw.update(lora_b=None)),
    ("b_slices", "lora_b", lambda kw: kw.update(lora_b=(kw["lora_b"][0],))),
    ("b_widths", "lora_b", _narrow_b),
    ("scales_shape", "scales", lambda kw: kw.update(scales=kw["scales"][:-1])),
    ("expert_range", "groups", _routes(expert_ids=[0] * 36 + [NUM_EXPERTS])),
    ("slot_range", "groups", _routes(slots=[0] * 36 + [NUM_PAGES], ranks=[*SLOT_RANKS, 4])),
    ("rank_above_max", "groups", _routes(slots=[1] * 37, ranks=[0, MAX_RANK + 1])),
    ("rows", "groups", lambda kw: kw.update(groups=group_routes([0], [0], SLOT_RANKS, "cpu")[1])),
]


@pytest.mark.parametrize(("name", "change"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_checked_names_the_bad_argument(name, change):
    p = problem(seed=9)
    order, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, "cpu")
    kw = dict(x=p.x[order], weight=p.weight, w_scale=None, lora_a=p.lora_a, lora_b=p.lora_b,
              scales=p.scales, groups=groups)  # fmt: skip
    expert_linear(**kw, checked=True)  # valid as given
    change(kw)
    with pytest.raises(ValueError, match=f"^{re.escape(name)}:"):
        expert_linear(**kw, checked=True)


@GPU
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_dispatch_on_cuda_bf16(fp8):
    """On CUDA the dispatch point runs the kernel: bfloat16, 300 rows, wider slices."""
    p = problem(num_rows=300, widths=(96, 96), dtype=torch.bfloat16, seed=10, fp8=fp8)
    order, groups = group_routes(p.expert_ids, p.slots, SLOT_RANKS, "cuda")
    cuda = partial(moved, device="cuda")
    y = expert_linear(cuda(p.x[order]), cuda(p.weight), cuda(p.w_scale), tuple(map(cuda, p.lora_a)),
                      tuple(map(cuda, p.lora_b)), cuda(p.scales), groups, checked=True)  # fmt: skip
    atol, rtol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(y.cpu().double(), oracle(p)[order.cpu()], atol=atol, rtol=rtol)
