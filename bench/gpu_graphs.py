"""The CUDA-graph check of bench/gpu_all.py: decode steps replayed from graphs against eager.

A 1B-shaped model (random weights, FP8 linears, bf16) with a slab of 32 rank-16 adapters on
every linear. Each row is timed side by side, interleaved:
  graphs / eager   the same decode step (every row a different adapter), batch 1 to 32
  adapters / base  the graph-replayed step with 32 adapters against base-only rows, batch 32
                   (target: throughput >= 0.85x base-only, so time <= 1.18x)
The dry run (CPU) runs the tiny shape with capture off: the replay is the padded eager step.
"""

from __future__ import annotations

from functools import partial

import torch

from adapters.format.adapter import parse_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from bench.adapters import adapter_files
from bench.model import BLOCK, eager_forward, planned_decode
from bench.model_shapes import SHAPES, config_for, random_state
from bench.timing import interleaved_seconds
from serving.model.decode_graphs import DecodeGraphs
from serving.model.llama import LlamaModel

CONTEXT, ADAPTERS = 512, 32


def graph_rows(device: str, dry_run: bool):
    shape, batches = ("tiny", (1, 4)) if dry_run else ("llama-1b", (1, 4, 16, 32))
    dtype = torch.float32 if dry_run else torch.bfloat16
    config = config_for(shape)
    model = LlamaModel(config, random_state(config, dtype, device), fp8=not dry_run, dtype=dtype)
    count = 4 if dry_run else ADAPTERS
    slab = _slab(shape, device, dtype, count)
    slots = [slab.acquire(f"a{i}") for i in range(count)]  # slab.num_slots counts pages
    context = 64 if dry_run else CONTEXT
    per_seq = -(-context // BLOCK)
    num_blocks = max(batches) * per_seq
    kv = model.allocate_kv(num_blocks + 1, BLOCK, device)
    graphs = DecodeGraphs(model, kv, slab, scratch_block=num_blocks, block_size=BLOCK,
                          max_context=context, max_batch=max(batches), capture=not dry_run)  # fmt: skip
    rows = []
    with torch.inference_mode():
        for batch in batches:
            step = planned_decode(batch, context, config.vocab_size, slots)
            assert graphs.covers(step)
            s = interleaved_seconds({
                "graphs": partial(graphs.forward, step),
                "eager": partial(eager_forward, model, step, kv, slab),
            }, rounds=1 if dry_run else 3)  # fmt: skip
            rows.append(_row("decode step graphs / eager", f"{shape}, batch {batch}, "
                             f"{min(batch, len(slots))} adapters", s["graphs"], s["eager"], None,
                             dry_run))  # fmt: skip
        batch = max(batches)
        mixed = planned_decode(batch, context, config.vocab_size, slots)
        base = planned_decode(batch, context, config.vocab_size, [-1])
        s = interleaved_seconds({
            "mixed": partial(graphs.forward, mixed), "base": partial(graphs.forward, base),
        }, rounds=1 if dry_run else 3)  # fmt: skip
        rows.append(_row(f"{len(slots)} adapters / base-only (graphs)", f"{shape}, batch {batch}",
                         s["mixed"], s["base"], 1 / 0.85, dry_run))  # fmt: skip
    slab.close()
    return rows


def _slab(shape: str, device: str, dtype, count: int) -> AdapterSlab:
    hidden, inter, layers, heads, kv, vocab = SHAPES[shape]
    spec = BaseModelSpec.from_config({
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
    })  # fmt: skip
    adapters = {f"a{i}": parse_adapter(adapter_files(spec, i), base=spec) for i in range(count)}
    return AdapterSlab(spec, num_slots=count, max_rank=16, max_cpu_loras=0, dtype=dtype,
                       loader=adapters.__getitem__, device=device)  # fmt: skip


def _row(what, shape, a: float, b: float, target: float | None, dry_run: bool):
    ratio = a / b
    ok = "-" if dry_run or target is None else ("yes" if ratio <= target else "no")
    goal = "(dry run)" if dry_run else (f"<= {target:.2f}x" if target else "(measured)")
    return (what, shape, f"{a * 1e3:.2f} ms vs {b * 1e3:.2f} ms", f"{ratio:.2f}x", goal, ok)
