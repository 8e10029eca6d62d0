"""LoRA apply (shrink + expand) on CPU, side by side with a per-adapter loop, the base matmul and a copy.

    python bench/kernels.py [--dtype float32|bfloat16] [--quick] [--variants] [--outer]

For each batch shape and number of distinct adapters it times, in one run:
  ours      lora_shrink + lora_expand over the batch (segments built once per step, timed apart)
  served    lora_apply_planned, what a model's step runs: on this CPU the compiled kernel
            (kernels/lora_cpu.c) where the batch has no long runs of one adapter, else ours
  loop      a PEFT-style loop: for each adapter, gather its rows, x @ A.T @ B.T * scale, scatter-add
  base      the base layer's matmul, x @ W.T, W [hidden, hidden]
  floor     the bytes that must move (x, each distinct adapter's A and B once, y) at the
            copy bandwidth measured beside the case, or, where larger, the LoRA FLOPs at the
            FLOP rate of the base GEMM (prefill is bound by arithmetic, not bytes)
and prints a markdown table with the ratios the targets are stated in:
  of floor    floor / ours         (target: >= 50% with 64 adapters)
  loop/ours   loop / ours          (target: > 1 with 8 and 64 adapters)
  lora/base   ours / base          (target: <= 10% with 1 adapter)
  layer vs 1  (base + ours) with N adapters / with 1   (target: <= 1.75x at 64 tokens, hidden 4096)
then the cost of DoRA and lora_bias rows against plain LoRA at decode shapes
(bench/kernels_variants.py; target: DoRA / plain <= 1.10x); --variants prints that table alone.
--outer prints the cost of embedding and LM-head LoRA rows against the base rows
(bench/kernels_outer.py) alone.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch

from bench.kernels_outer import outer_rows
from bench.kernels_variants import variant_rows
from bench.timing import copier, interleaved_seconds, machine
from kernels import build_segments, lora_apply_planned, lora_expand, lora_shrink

RANK = 16
NUM_SLOTS = 64
COLD_BYTES = 128 * 2**20  # well past this CPU's 32 MiB last-level cache


@dataclass(frozen=True)
class Layer:
    """One layer's weights: the slab stacks, the same adapters as PEFT holds them, the base W."""

    a: torch.Tensor  # [slots, max_rank, hidden]
    b: torch.Tensor  # [slots, max_rank, hidden]  (B transposed)
    a_peft: list  # lora_A.weight [r, in] per adapter
    b_peft: list  # lora_B.weight [out, r] per adapter
    w: torch.Tensor  # [hidden, hidden]

    @staticmethod
    def make(hidden, max_rank, dtype, gen):
        a = (torch.randn(NUM_SLOTS, max_rank, hidden, generator=gen) / hidden**0.5).to(dtype)
        b = (torch.randn(NUM_SLOTS, max_rank, hidden, generator=gen) / RANK**0.5).to(dtype)
        return Layer(
            a=a,
            b=b,
            a_peft=[a[s, :RANK].contiguous() for s in range(NUM_SLOTS)],
            b_peft=[b[s, :RANK].T.contiguous() for s in range(NUM_SLOTS)],
            w=(torch.randn(hidden, hidden, generator=gen) / hidden**0.5).to(dtype),
        )


def batch_slots(num_tokens: int, num_adapters: int) -> torch.Tensor:
    """Decode (<= 256 tokens): one token per sequence, adapters interleaved.
    Prefill: a few sequences whose tokens are adjacent, each sequence one adapter."""
    if num_tokens <= 256:
        return (torch.arange(num_tokens) % num_adapters).to(torch.int32)
    return torch.arange(num_adapters).repeat_interleave(num_tokens // num_adapters).to(torch.int32)


def peft_loop(x, y, slots, a_peft, b_peft, scales):
    """What PEFT's mixed-batch forward does: one pass per adapter present in the batch."""
    for slot in slots.unique().tolist():
        rows = (slots == slot).nonzero().squeeze(1)
        sub = x.index_select(0, rows)
        y.index_add_(0, rows, (sub @ a_peft[slot].T) @ b_peft[slot].T * scales[slot])


def run_case(num_tokens, hidden, num_adapters, dtype, max_rank=RANK):
    gen = torch.Generator().manual_seed(num_tokens * 7 + hidden + num_adapters)
    # A model has a slab per layer, so a step never finds the last layer's adapters in cache:
    # rotate through enough layers that their weights together exceed the CPU caches.
    layer_bytes = NUM_SLOTS * 2 * max_rank * hidden * torch.finfo(dtype).bits // 8
    num_layers = max(2, -(-COLD_BYTES // layer_bytes))
    layers = [Layer.make(hidden, max_rank, dtype, gen) for _ in range(num_layers)]
    turn = itertools.cycle(range(num_layers))
    ranks = torch.full((NUM_SLOTS,), RANK, dtype=torch.int32)
    scales = torch.full((NUM_SLOTS,), 2.0)
    slots = batch_slots(num_tokens, num_adapters)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    y = torch.zeros(num_tokens, hidden, dtype=dtype)
    t = torch.empty(num_tokens, max_rank)
    segments = build_segments(slots, ranks)

    def ours(layer=None):
        layer = layer or layers[next(turn)]
        lora_shrink(x, layer.a, t, segments)
        lora_expand(t, layer.b, y, segments, scales)

    def served():
        layer = layers[next(turn)]
        lora_apply_planned(x, (layer.a,), (layer.b,), y, segments, scales, max_rank)

    def loop():
        layer = layers[next(turn)]
        peft_loop(x, y, slots.long(), layer.a_peft, layer.b_peft, scales.tolist())

    def base(layer=None):
        torch.mm(x, (layer or layers[next(turn)]).w.T, out=y)

    def whole_layer():
        layer = layers[next(turn)]
        base(layer)
        ours(layer)

    copy, copy_bytes = copier()
    seconds = interleaved_seconds(
        {
            "ours": ours,
            "served": served,
            "loop": loop,
            "base": base,
            "layer": whole_layer,
            "segments": lambda: build_segments(slots, ranks),
            "copy": copy,
        }
    )
    seconds["bandwidth"] = copy_bytes / seconds["copy"]
    size = x.element_size()
    floor_bytes = 2 * num_tokens * hidden * size + num_adapters * 2 * RANK * hidden * size
    # Prefill is bound by arithmetic, not bytes: its floor is the LoRA FLOPs at the rate the
    # base GEMM of this very layer reaches (the best this CPU does on these shapes).
    lora_flops = 2 * 2 * num_tokens * hidden * RANK
    gemm_rate = 2 * num_tokens * hidden * hidden / seconds["base"]
    seconds["floor"] = max(floor_bytes / seconds["bandwidth"], lora_flops / gemm_rate)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="one small case (a smoke run)")
    parser.add_argument("--variants", action="store_true", help="only the LoRA-variants table")
    parser.add_argument("--outer", action="store_true", help="only the embed/lm_head LoRA table")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)

    print(f"machine: {machine()}; {args.dtype}, rank {RANK}; each row's timings interleaved\n")
    if args.variants:
        print("\n".join(variant_rows(dtype, args.quick)))
        return
    if args.outer:
        print("\n".join(outer_rows(dtype, args.quick)))
        return
    shapes = [(64, 2048)] if args.quick else [(t, h) for h in (2048, 4096) for t in (64, 256, 2048)]
    print(
        "| tokens | hidden | adapters | ours ms | served ms | loop ms | base ms | floor ms "
        "| copy GB/s | of floor | loop/ours | lora/base | layer vs 1 | segments us |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for num_tokens, hidden in shapes:
        one = None
        for num_adapters in (1, 8, 64):
            s = run_case(num_tokens, hidden, num_adapters, dtype)
            one = one or s
            print(
                f"| {num_tokens} | {hidden} | {num_adapters} | {s['ours'] * 1e3:.3f} "
                f"| {s['served'] * 1e3:.3f} | {s['loop'] * 1e3:.3f} | {s['base'] * 1e3:.3f} | {s['floor'] * 1e3:.3f} "
                f"| {s['bandwidth'] / 1e9:.0f} | {s['floor'] / s['ours']:.0%} "
                f"| {s['loop'] / s['ours']:.2f}x | {s['ours'] / s['base']:.1%} "
                f"| {s['layer'] / one['layer']:.2f}x | {s['segments'] * 1e6:.0f} |",
                flush=True,
            )

    if (
        not args.quick
    ):  # rank-aware: rank-16 adapters in a rank-64 slab should cost what rank 16 costs
        s16 = run_case(64, 4096, 64, dtype)
        s64 = run_case(64, 4096, 64, dtype, max_rank=64)
        print(
            f"\nrank 16 in a rank-64 slab (64 tokens, hidden 4096, 64 adapters): {s64['ours'] * 1e3:.3f} ms "
            f"vs {s16['ours'] * 1e3:.3f} ms in a rank-16 slab ({s64['ours'] / s16['ours']:.2f}x)"
        )
        print("\n" + "\n".join(variant_rows(dtype, quick=False)))


if __name__ == "__main__":
    main()
