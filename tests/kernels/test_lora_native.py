"""The compiled CPU LoRA kernel (kernels/lora_cpu.c) against the float64 oracle, the indices
it is refused, and when it is given up on (how it is built and cached: test_native_build)."""

import contextlib
import dataclasses
import logging
import re
import shutil

import pytest
import torch

from kernels import build_segments, lora_apply_planned, lora_native, native_build
from kernels.lora_reference import expand_oracle, shrink_oracle
from tests.kernels.cases import TOLERANCE
from tests.kernels.test_cpu_plan_ways import LAYOUTS, make

# The kernel is built only where a C compiler is (CI and the image have gcc); without one the
# torch path serves, which the fallback tests below cover on every machine.
needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The module as in a new process, its cache in an empty home."""
    monkeypatch.setattr(lora_native, "_kernel", None)
    monkeypatch.setattr(lora_native, "_tried", False)
    monkeypatch.setattr(native_build, "_built", {})
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def spy(monkeypatch) -> list[int]:
    """Counts the compiled kernel's runs (calls that did the work)."""
    calls = []
    real = lora_native.lora_apply_rows

    def counted(*args):
        ran = real(*args)
        if ran:
            calls.append(1)
        return ran

    monkeypatch.setattr(lora_native, "lora_apply_rows", counted)
    return calls


@needs_compiler
def test_builds_and_loads_where_there_is_a_compiler(fresh):
    assert lora_native.available()
    assert len(list((fresh / ".cache" / "loraserve" / "native").glob("cpu_kernels-*.so"))) == 1


@needs_compiler
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("widths", [(40,), (40, 8, 8)])
@pytest.mark.parametrize("scales_kind", ["uniform", "per slot"])
def test_decode_step_matches_the_oracle(layout, widths, scales_kind, monkeypatch):
    """Every layout, fused or not: each token with its own slot's rank (the slab's rows past
    a rank are NaN here, so a read of one shows), base-only rows untouched."""
    calls = spy(monkeypatch)
    x, a, b, scales, ids, ranks, segments = make(layout, torch.float32, widths, scales_kind, 3)
    y = torch.randn(x.shape[0], sum(widths))
    y_before = y.clone()
    lora_apply_planned(x, a, b, y, segments, scales, 16, host_scales=scales.tolist())
    assert calls == [1]
    want = expand_oracle(y_before, shrink_oracle(x, a, ids, ranks), b, ids, ranks, scales)
    assert torch.equal(y[ids < 0], y_before[ids < 0]), "changed a row of a base-only token"
    torch.testing.assert_close(y.double(), want, atol=TOLERANCE[torch.float32][0], rtol=2e-4)


@needs_compiler
def test_a_step_of_uneven_short_runs_runs_it_too(monkeypatch):
    """Neither padded nor in place (slot 0's tokens in short runs, slot 3's one token, too
    uneven to pad): the grouped way's step, run by the kernel."""
    calls = spy(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    slots, ranks = [0, 3, 0, 0, -1, 0, 0, 1, 0, 0], [8, 4, 4, 8]
    ids, rk = torch.tensor(slots), torch.tensor(ranks)
    segments = build_segments(ids, rk, host=(slots, ranks))
    groups = segments.cpu_plan.groups
    assert all(g.padded is None and not g.in_place for g in groups if g.rank == 8)
    a = (torch.randn(4, 16, 48, generator=gen), torch.randn(4, 16, 48, generator=gen))
    b = (torch.randn(4, 16, 24, generator=gen), torch.randn(4, 16, 8, generator=gen))
    x, scales = torch.randn(len(slots), 48, generator=gen), torch.rand(4, generator=gen)
    y = torch.zeros(len(slots), 32)
    lora_apply_planned(x, a, b, y, segments, scales, 16)
    assert calls == [1]
    want = expand_oracle(torch.zeros_like(y), shrink_oracle(x, a, ids, rk), b, ids, rk, scales)
    torch.testing.assert_close(y.double(), want, atol=2e-4, rtol=2e-4)


@needs_compiler
def test_strided_rows_and_one_thread_or_two(monkeypatch):
    """x and y as column windows of wider tensors (row strides not their widths): only the
    window's columns change, and one thread gives what two do."""
    calls = spy(monkeypatch)
    x, a, b, scales, ids, ranks, segments = make("one each", torch.float32, (40, 8, 8), "per slot")
    wide_x = torch.randn(x.shape[0], 70)
    wide_x[:, 11:59] = x
    wide_y = torch.randn(x.shape[0], 90)
    before = wide_y.clone()
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = before.clone()
            lora_apply_planned(wide_x[:, 11:59], a, b, y[:, 20:76], segments, scales, 16)
            results.append(y)
    finally:
        torch.set_num_threads(threads)
    assert calls == [1, 1]
    for y in results:
        assert torch.equal(y[:, :20], before[:, :20]) and torch.equal(y[:, 76:], before[:, 76:])
    want = expand_oracle(before[:, 20:76], shrink_oracle(x, a, ids, ranks), b, ids, ranks, scales)
    torch.testing.assert_close(results[0][:, 20:76].double(), want, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=1e-6)


def test_other_dtypes_and_long_runs_take_the_torch_path(monkeypatch):
    calls = spy(monkeypatch)
    x, a, b, scales, _, _, segments = make("four each", torch.bfloat16, (40,), "uniform")
    lora_apply_planned(x, a, b, torch.zeros(x.shape[0], 40, dtype=torch.bfloat16), segments,
                       scales, 16)  # fmt: skip
    slots, slot_ranks = [0] * 40 + [1] * 40, [8, 4]
    prefill = build_segments(torch.tensor(slots), torch.tensor(slot_ranks), (slots, slot_ranks))
    assert prefill.cpu_plan.token_ranks is None  # runs in place, not padded
    lora_apply_planned(torch.randn(80, 48), (torch.randn(2, 16, 48),), (torch.randn(2, 16, 8),),
                       torch.zeros(80, 8), prefill, torch.ones(2), 16)  # fmt: skip
    assert calls == []


def test_switched_off_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv("LORASERVE_CPU_NATIVE", "0")
    assert not lora_native.available()
    calls = spy(monkeypatch)
    x, a, b, scales, ids, ranks, segments = make("uneven", torch.float32, (40,), "uniform")
    y = torch.zeros(x.shape[0], 40)
    lora_apply_planned(x, a, b, y, segments, scales, 16)
    assert calls == []
    want = expand_oracle(torch.zeros_like(y), shrink_oracle(x, a, ids, ranks), b, ids, ranks,
                         scales)  # fmt: skip
    torch.testing.assert_close(y.double(), want, atol=2e-4, rtol=2e-4)


def test_a_failed_build_falls_back_with_a_warning(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    with caplog.at_level(logging.WARNING, logger="kernels.lora_native"):
        assert not lora_native.available()
    assert "unavailable" in caplog.text and "false failed" in caplog.text
    assert not list(fresh.rglob("*.so")), "left a half-built library in the cache"


@needs_compiler
def test_operands_that_do_not_fit_never_reach_the_kernel(monkeypatch):
    """A y too narrow for the slices, or a slot rank past the stacks' rows: the kernel would
    read or write out of bounds, so the torch path runs (and raises) instead."""
    calls = spy(monkeypatch)
    x, a, b, scales, _, _, segments = make("one each", torch.float32, (40, 8, 8), "uniform")
    with pytest.raises(RuntimeError):
        lora_apply_planned(x, a, b, torch.zeros(x.shape[0], 50), segments, scales, 16)
    short = tuple(t[:, :4] for t in a), tuple(t[:, :4] for t in b)  # ranks 8 > 4 rows
    y = torch.zeros(x.shape[0], 56)
    with contextlib.suppress(RuntimeError, ValueError, IndexError):  # the torch path's say
        lora_apply_planned(x, *short, y, segments, scales, 16)
    assert calls == []


@pytest.fixture
def recorded(monkeypatch) -> list[tuple]:
    """The loaded library's entry point replaced by one that records its calls, compiler or not."""
    calls = []
    monkeypatch.setattr(lora_native, "_kernel", lambda *args: calls.append(args))
    monkeypatch.setattr(lora_native, "_tried", True)
    return calls


def test_every_valid_plan_of_the_grid_reaches_the_kernel(recorded):
    for layout in sorted(LAYOUTS):
        x, a, b, scales, _, _, segments = make(layout, torch.float32, (40, 8, 8), "per slot")
        before = len(recorded)
        lora_apply_planned(x, a, b, torch.zeros(x.shape[0], 56), segments, scales, 16)
        runs_in_place = segments.cpu_plan.token_ranks is None
        assert len(recorded) == before + (not runs_in_place), layout


def _with(segments, **changed):
    """segments with some of its (and its plan's) index tensors replaced."""
    ranks = changed.pop("token_ranks", segments.cpu_plan.token_ranks)
    plan = dataclasses.replace(segments.cpu_plan, token_ranks=ranks)
    return dataclasses.replace(segments, cpu_plan=plan, **changed)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: {"token_slots": s.token_slots.clone().fill_(6)}, "slots: slot 6 is out of range; expected 0..5"),
        (lambda s: {"token_slots": s.token_slots.clone().fill_(-1)}, "slots: slot -1 is out of range"),
        (lambda s: {"token_order": s.token_order + 1}, "order: row 6 is out of range; expected 0..5"),
        (lambda s: {"token_order": s.token_order - 1}, "order: row -1 is out of range"),
        (lambda s: {"token_ranks": s.cpu_plan.token_ranks + 9}, "ranks: rank 17 is out of range; expected 0..16"),
        (lambda s: {"token_ranks": s.cpu_plan.token_ranks - 9}, "ranks: rank -1 is out of range"),
        (lambda s: {"token_ranks": s.cpu_plan.token_ranks[1:]}, "expected one entry per active token each, got 6, 6 and 5"),
    ],
    ids=["slot past", "base-only slot", "row past", "row below", "rank past", "rank below", "lengths"],
)  # fmt: skip
def test_an_index_out_of_bounds_is_a_value_error_before_the_kernel(recorded, change, message):
    """A plan whose slot, row or rank would send the kernel outside its operands (slot 6 of
    six, row 6 of six tokens, rank 17 of 16 rows) names the index, and the kernel never runs."""
    x, a, b, scales, _, _, segments = make("one each", torch.float32, (40, 8, 8), "per slot")
    bad = _with(segments, **change(segments))
    y = torch.zeros(x.shape[0], 56)
    with pytest.raises(ValueError, match=re.escape(message)):
        lora_apply_planned(x, a, b, y, bad, scales, 16)
    assert recorded == []
    assert not y.any()
