"""Where a decode step's time goes as adapters are added, against base-only (CPU).

    python -m bench.engine --where

Every decode step of the timed window (one token for each prompt) is timed whole, and
within it the time spent in the base linears (`Linear.__call__`), in the LoRA ops
(`lora_apply_planned`; the checked shrink and expand under LORASERVE_CHECKS=1) and in
building the step's LoRA plan (`step_lora`: the segments and the CPU plan, once a step),
by wrapping each in a clock (two perf_counter calls, under a microsecond, against calls of
tens of microseconds). The rest is attention, norms, sampling and the engine's own work.
With 4 adapters a step makes the same torch calls as with 32 but reads an eighth of the
adapters' bytes, so the two rows split the LoRA cost into what the calls cost and what the
bytes cost. The LoRA ops' rate is the adapters' bytes over their time, beside the host's
copy rate measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import serving.model.linear as linear_module
import serving.model.llama as llama_module
from bench.engine_share import SHAPES, linear_bytes
from bench.peers.tiny_world import build
from bench.timing import copier, median_seconds
from serving.engine.engine import Engine
from serving.engine.runner import Forward
from serving.model.linear import Linear

COUNTS = {"tiny (hidden 256)": (0, 4, 32), "medium (hidden 768)": (0, 32)}


@contextmanager
def clocked(num_tokens: int) -> Iterator[list[tuple[float, ...]]]:
    """Within: every engine step whose forward ran exactly num_tokens tokens appends
    (step, forward, base linears, LoRA ops, LoRA plan) seconds to the yielded list."""
    clock = {"base": 0.0, "lora": 0.0, "plan": 0.0, "forward": 0.0, "tokens": 0}
    steps: list[tuple[float, ...]] = []
    saved = (Linear.__call__, linear_module.lora_apply_planned, Forward.__call__, Engine.step,
             llama_module.step_lora, linear_module.lora_shrink, linear_module.lora_expand)  # fmt: skip

    def timed(key, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock[key] += time.perf_counter() - start

        return call

    def forward(self, inputs):
        clock["tokens"] = inputs.token_ids.numel()
        return timed("forward", saved[2])(self, inputs)

    def step(self):
        clock.update(base=0.0, lora=0.0, plan=0.0, forward=0.0, tokens=0)
        start = time.perf_counter()
        busy = saved[3](self)
        if clock["tokens"] == num_tokens:
            seconds = time.perf_counter() - start
            steps.append((seconds, *(clock[k] for k in ("forward", "base", "lora", "plan"))))
        return busy

    Linear.__call__ = timed("base", saved[0])
    linear_module.lora_apply_planned = timed("lora", saved[1])
    Forward.__call__, Engine.step = forward, step
    llama_module.step_lora = timed("plan", saved[4])
    # LORASERVE_CHECKS=1 (tests) runs the checked ops in each layer instead of the planned one.
    linear_module.lora_shrink, linear_module.lora_expand = (timed("lora", f) for f in saved[5:])
    try:
        yield steps
    finally:
        Linear.__call__, linear_module.lora_apply_planned, Forward.__call__, Engine.step = saved[:4]
        llama_module.step_lora, linear_module.lora_shrink, linear_module.lora_expand = saved[4:]


def where_rows(tmp: Path, num_prompts: int = 32, rounds: int = 5, quick: bool = False) -> list[str]:
    """Per-step milliseconds of each adapter count, the counts' runs taken in turns (quick:
    the tiny model's 0 and 4 adapters, one round)."""
    from bench.engine import loraserve_run, workload

    counts = {"tiny (hidden 256)": (0, 4)} if quick else COUNTS
    rounds = 1 if quick else rounds
    copy, copy_bytes = copier()
    copy_gbs = copy_bytes / median_seconds(copy) / 1e9
    lines = [
        f"{num_prompts} prompts, rank 8, median of {rounds} rounds; host copy rate "
        f"{copy_gbs:.0f} GB/s",
        "",
        "| model | adapters | adapters MB | step ms | forward ms | base linears ms "
        "| LoRA ops ms | LoRA ops GB/s | LoRA plan ms | rest ms | step vs base-only |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, model_counts in counts.items():
        shape = SHAPES[label][0]
        world = build(tmp / f"where-{label[:4]}", rank=8, num_adapters=max(model_counts), **shape)
        names = sorted(world["adapters"])
        per_adapter = linear_bytes(world["adapters"][names[0]] / "adapter_model.safetensors")
        runs: dict[int, list[list[float]]] = {count: [] for count in model_counts}
        for _ in range(rounds):
            for count in model_counts:
                with clocked(num_prompts) as steps:
                    loraserve_run(world, workload(num_prompts, names[:count]), count)
                assert steps, "no decode step of the timed window was seen"
                runs[count].append([statistics.median(column) for column in zip(*steps)])
        ms = {c: [1e3 * statistics.median(col) for col in zip(*r)] for c, r in runs.items()}
        for count in model_counts:
            step, forward, base, lora, plan = ms[count]
            mb = count * per_adapter / 1e6
            rate = f"{mb / lora:.1f}" if count and lora > 0 else "-"  # MB/ms = GB/s
            lines.append(
                f"| {label} | {count} | {mb:.1f} | {step:.2f} | {forward:.2f} | {base:.2f} "
                f"| {lora:.2f} | {rate} | {plan:.2f} | {step - base - lora - plan:.2f} "
                f"| {ms[0][0] / step:.2f}x |"
            )
    return lines
