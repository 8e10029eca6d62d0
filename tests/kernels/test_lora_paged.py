"""Every LoRA kernel path on the adapter slab's paged stacks, against the float64 oracle.

The stacks' slots overlap (stride(0) = page_rank * width) and every row no adapter holds is
NaN (tests/kernels/paged.py): a mixed batch of ranks 1..64 over pages of 8 rows must come
out as the oracle's, through the torch ways (in place, padded, grouped with the
embedding_bag expand, the fused padded apply), the compiled CPU kernel and the Triton
kernels (in the interpreter without a GPU: float32 and float16, small sizes).
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from kernels import (
    build_segments,
    cpu_plan,
    lora_apply_planned,
    lora_expand,
    lora_native,
    lora_shrink,
)
from kernels.lora_reference import expand_oracle, shrink_oracle
from tests.kernels.cases import TOLERANCE
from tests.kernels.paged import Paged

HIDDEN, WIDTHS = 40, (40, 12, 12)  # a fused q|k|v: one A per B slice


def inputs(kind: str, dtype=torch.float32, seed=0, widths=WIDTHS, device="cpu"):
    """(x, A slices, B slices, scales, token slots, slot ranks) over the paged layout."""
    gen = torch.Generator().manual_seed(seed)
    paged = Paged()
    lora_a = tuple(paged.stack(HIDDEN, HIDDEN, gen, dtype, device) for _ in widths)
    lora_b = tuple(paged.stack(w, paged.max_rank, gen, dtype, device) for w in widths)
    slots = paged.tokens(kind, gen)
    x = torch.randn(len(slots), HIDDEN, generator=gen).to(dtype)
    ids = torch.tensor(slots, dtype=torch.int32)
    return x, lora_a, lora_b, paged.scales(gen), ids, paged.slot_ranks()


def oracle(x, lora_a, lora_b, y, ids, ranks, scales) -> torch.Tensor:
    """y + scale * (x @ A.T) @ B per token, in float64."""
    t = shrink_oracle(x, lora_a, ids, ranks).nan_to_num(0.0)
    return expand_oracle(y, t, lora_b, ids, ranks, scales)


def check(y, y_before, want, ids, dtype) -> None:
    base = ids < 0
    assert torch.equal(y[base], y_before[base]), "changed a row of a base-only token"
    assert not y.isnan().any(), "read a row no adapter holds"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(y.double(), want, atol=atol, rtol=rtol)


def test_the_layout_is_the_slabs():
    _, (a, *_), _, _, _, ranks = inputs("decode")
    assert a.shape == (20, 64, HIDDEN) and a.stride() == (8 * HIDDEN, HIDDEN, 1)
    assert ranks.tolist()[:9] == [4, 0, 8, 12, 0, 16, 0, 0, 64]  # continuation pages: 0


WAYS = {  # way -> (tokens, plan knobs that force it, what the plan must show)
    "in place": ("runs", {}, lambda p: all(g.in_place for g in p.groups)),
    # padding over free and continuation pages, whose rows are NaN: none may leak
    "padded": ("decode", {"MAX_PADDING": 1e9}, lambda p: p.all_padded),
    "grouped": ("decode", {"MAX_PADDED_TOKENS": 0}, lambda p: all(g.parts for g in p.groups)),
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_torch_ways_through_the_checked_ops(way, monkeypatch):
    kind, knobs, shown = WAYS[way]
    for name, value in knobs.items():
        monkeypatch.setattr(cpu_plan, name, value)
    x, lora_a, lora_b, scales, ids, ranks = inputs(kind, seed=len(way))
    segments = build_segments(ids, ranks)
    assert shown(segments.cpu_plan)
    t = lora_shrink(x, list(lora_a), torch.zeros(len(WIDTHS), len(ids), 64), segments)
    y = torch.randn(len(ids), sum(WIDTHS))
    y_before = y.clone()
    lora_expand(t, list(lora_b), y, segments, scales)
    check(y, y_before, oracle(x, lora_a, lora_b, y_before, ids, ranks, scales), ids, x.dtype)


@pytest.mark.parametrize("native", [False, True], ids=["fused padded", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_as_the_model_runs_it(native, dtype, monkeypatch):
    """lora_apply_planned with host lists: the compiled kernel where it builds (float32),
    else the padded shrink and expand fused."""
    if native and (dtype != torch.float32 or shutil.which("cc") is None):
        pytest.skip("the compiled kernel runs float32, where there is a C compiler")
    monkeypatch.setattr(cpu_plan, "MAX_PADDING", 1e9)  # every group padded, over NaN pages
    ran = []
    real = lora_native.lora_apply_rows
    monkeypatch.setattr(lora_native, "lora_apply_rows", lambda *a: ran.append(real(*a)) or ran[-1])
    if not native:
        monkeypatch.setattr(lora_native, "available", lambda: False)
    x, lora_a, lora_b, scales, ids, ranks = inputs("decode", dtype, seed=3)
    segments = build_segments(ids, ranks, host=(ids.tolist(), ranks.tolist()))
    y = torch.randn(len(ids), sum(WIDTHS)).to(dtype)
    y_before = y.clone()
    lora_apply_planned(x, lora_a, lora_b, y, segments, scales, 64, host_scales=scales.tolist())
    assert ran == ([True] if native else [])
    check(y, y_before, oracle(x, lora_a, lora_b, y_before, ids, ranks, scales), ids, dtype)


def test_the_compiled_kernel_refuses_a_slot_past_the_pages():
    x, lora_a, lora_b, scales, ids, _ = inputs("decode")
    if not lora_native.available():
        pytest.skip("no compiled kernel here")
    order = torch.arange(len(ids), dtype=torch.int64)
    slots = torch.full((len(ids),), 20, dtype=torch.int32)  # one page past the last
    ranks_t = torch.full((len(ids),), 64, dtype=torch.int32)
    y = torch.zeros(len(ids), sum(WIDTHS))
    with pytest.raises(ValueError, match=r"slots: slot 20 is out of range; expected 0..19"):
        lora_native.lora_apply_rows(x, lora_a, lora_b, y, order, slots, ranks_t, scales)


def _on(device, segments):
    fields = ("token_order", "token_slots", "seg_starts", "seg_slots", "seg_ranks")
    moved = {f: getattr(segments, f).to(device) for f in fields}
    return dataclasses.replace(segments, **moved, cpu_plan=None)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
)
def test_triton_shrink_and_expand(dtype):
    """The Triton kernels read slots by the stacks' strides (interpreted without a GPU, where
    bf16's dot is wrong: bf16 on a GPU only)."""
    from kernels.lora_expand_triton import lora_expand_triton
    from kernels.lora_shrink_triton import lora_shrink_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    widths = (24, 8)
    x, lora_a, lora_b, scales, ids, ranks = inputs("decode", dtype, 5, widths, device)
    host_a, host_b = [a.cpu() for a in lora_a], [b.cpu() for b in lora_b]  # for the oracle
    segments = _on(device, build_segments(ids, ranks))
    t = torch.full((len(widths), len(ids), 64), -7777.0, device=device)
    lora_shrink_triton(x.to(device), lora_a, t, segments)
    want_t = shrink_oracle(x, host_a, ids, ranks)
    live = ~want_t.isnan()
    t = t.cpu()
    assert (t[~live] == -7777.0).all(), "wrote a base-only row or a column past a rank"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(t[live].double(), want_t[live], atol=atol, rtol=rtol)
    y = torch.randn(len(ids), sum(widths)).to(dtype)
    y_dev = y.clone().to(device)
    lora_expand_triton(t.to(device), lora_b, y_dev, segments, scales.to(device))
    want = expand_oracle(y, t.nan_to_num(0.0), host_b, ids, ranks, scales)
    check(y_dev.cpu(), y, want, ids, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["decode", "runs"])
def test_a_layer_on_cuda_reads_the_pages(dtype, kind):
    """lora_apply_planned on CUDA, the shrink's split-K parts added up by the expand, over
    paged stacks whose free rows are NaN."""
    x, lora_a, lora_b, scales, ids, ranks = inputs(kind, dtype, 7, WIDTHS, "cuda")
    segments = build_segments(ids.cuda(), ranks.cuda())
    y = torch.randn(len(ids), sum(WIDTHS)).to(dtype)
    y_dev = y.clone().cuda()
    lora_apply_planned(x.cuda(), lora_a, lora_b, y_dev, segments, scales.cuda(), 64)
    host_a, host_b = [a.cpu() for a in lora_a], [b.cpu() for b in lora_b]
    check(y_dev.cpu(), y, oracle(x, host_a, host_b, y, ids, ranks, scales), ids, dtype)
