"""The cost of PEFT's LoRA variants at decode shapes, for bench/kernels.py (CPU).

One projection (hidden -> hidden, as o_proj), a decode batch whose every token uses one of
8 rank-16 adapters; timed interleaved, in one run:
  plain   lora_linear: the base matmul, then shrink + expand
  dora    the same plus dora_rescale on every row (every adapter DoRA, the worst case)
  bias    the same plus lora_bias_add on every row
  rows    dora_rescale alone, against shrink + expand alone (the LoRA part of plain)
"""

from __future__ import annotations

import itertools

import torch

from bench.timing import interleaved_seconds
from kernels import build_segments, dora_rescale, lora_expand, lora_shrink
from serving.model.linear import Linear, LoraStacks, RowSet, StepLora, lora_linear

RANK, NUM_SLOTS, NUM_ADAPTERS = 16, 8, 8
COLD_BYTES = 128 * 2**20  # past the last-level cache, as a model's many layers are


def run_case(num_tokens: int, hidden: int, dtype: torch.dtype) -> dict[str, float]:
    gen = torch.Generator().manual_seed(num_tokens + hidden)
    like = {"dtype": dtype}
    layer_bytes = hidden * hidden * torch.finfo(dtype).bits // 8
    num_layers = max(2, -(-COLD_BYTES // layer_bytes))
    layers = []
    for _ in range(num_layers):
        w = (torch.randn(hidden, hidden, generator=gen) / hidden**0.5).to(dtype)
        a = (torch.randn(NUM_SLOTS, RANK, hidden, generator=gen) / hidden**0.5).to(dtype)
        b = (torch.randn(NUM_SLOTS, RANK, hidden, generator=gen) / RANK**0.5).to(dtype)
        g = (1 + 0.1 * torch.randn(NUM_SLOTS, hidden, generator=gen)).to(dtype)
        bias = (0.1 * torch.randn(NUM_SLOTS, hidden, generator=gen)).to(dtype)
        base = Linear(w, None, torch.zeros(hidden, **like))
        layers.append((base, LoraStacks((a,), (b,), (bias,), (g,))))
    turn = itertools.cycle(layers)
    slots = (torch.arange(num_tokens) % NUM_ADAPTERS).to(torch.int32)
    ranks = torch.full((NUM_SLOTS,), RANK, dtype=torch.int32)
    segments = build_segments(slots, ranks)
    every = RowSet(torch.arange(num_tokens), slots.long())  # every row uses the variant
    step = {
        "plain": StepLora(segments, torch.full((NUM_SLOTS,), 2.0), RANK),
        "dora": StepLora(segments, torch.full((NUM_SLOTS,), 2.0), RANK, dora_rows=every),
        "bias": StepLora(segments, torch.full((NUM_SLOTS,), 2.0), RANK, bias_rows=every),
    }
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    y = torch.zeros(num_tokens, hidden, **like)
    t = torch.empty(num_tokens, RANK)

    def layer(kind):
        base, stacks = next(turn)
        return lambda: lora_linear(x, base, stacks, step[kind])

    def lora_only():
        _, stacks = next(turn)
        lora_shrink(x, stacks.a[0], t, segments)
        lora_expand(t, stacks.b[0], y, segments, step["plain"].scales)

    def rows_only():
        base, stacks = next(turn)
        dora_rescale(y, stacks.dora, every.rows, every.slots, base.bias)

    return interleaved_seconds(
        {
            "plain": lambda: layer("plain")(),
            "dora": lambda: layer("dora")(),
            "bias": lambda: layer("bias")(),
            "lora": lora_only,
            "rows": rows_only,
        }
    )


def variant_rows(dtype: torch.dtype, quick: bool) -> list[str]:
    """The markdown table: each variant's layer against plain LoRA's, at decode shapes."""
    shapes = [(64, 2048)] if quick else [(t, h) for h in (2048, 4096) for t in (16, 64, 256)]
    lines = [
        "| tokens | hidden | plain ms | DoRA ms | lora_bias ms | DoRA / plain "
        "| bias / plain | DoRA rows / shrink+expand |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for num_tokens, hidden in shapes:
        s = run_case(num_tokens, hidden, dtype)
        lines.append(
            f"| {num_tokens} | {hidden} | {s['plain'] * 1e3:.3f} | {s['dora'] * 1e3:.3f} "
            f"| {s['bias'] * 1e3:.3f} | {s['dora'] / s['plain']:.2f}x "
            f"| {s['bias'] / s['plain']:.2f}x | {s['rows'] / s['lora']:.0%} |"
        )
    return lines
