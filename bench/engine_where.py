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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest.mock import patch

import serving.model.linear as linear_module
import serving.model.step_plan as step_plan_module
from bench.engine_runs import loraserve_run, side_by_side, workload
from bench.engine_share import SHAPES, linear_bytes
from bench.peers.tiny_world import build
from bench.timing import copier, median_seconds
from serving.engine.engine import Engine
from serving.engine.runner import Forward
from serving.model.linear import Linear

COUNTS = {"tiny (hidden 256)": (0, 4, 32), "medium (hidden 768)": (0, 32)}
PARTS = ("forward", "base", "lora", "plan")
# (owner, name, part): the functions clocked within a step. LORASERVE_CHECKS=1 (tests) runs
# the checked shrink and expand in each layer instead of lora_apply_planned.
CLOCKED = (
    (Forward, "__call__", "forward"),
    (Linear, "__call__", "base"),
    (linear_module, "lora_apply_planned", "lora"),
    (linear_module, "lora_shrink", "lora"),
    (linear_module, "lora_expand", "lora"),
    (step_plan_module, "step_lora", "plan"),
)


@contextmanager
def clocked(num_tokens: int) -> Iterator[list[tuple[float, ...]]]:
    """Within: every engine step whose forward ran exactly num_tokens tokens appends
    (step, forward, base linears, LoRA ops, LoRA plan) seconds to the yielded list."""
    clock = dict.fromkeys(PARTS, 0.0)
    tokens: list[int] = []  # the step's forward's token count, once it ran
    steps: list[tuple[float, ...]] = []

    def timed(part, fn):
        def call(*args, **kwargs):
            if part == "forward":
                tokens.append(args[1].token_ids.numel())  # args: (Forward, StepInputs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock[part] += time.perf_counter() - start

        return call

    def step(self, engine_step=Engine.step):
        clock.update(dict.fromkeys(PARTS, 0.0))
        tokens.clear()
        start = time.perf_counter()
        busy = engine_step(self)
        if tokens == [num_tokens]:
            steps.append((time.perf_counter() - start, *(clock[p] for p in PARTS)))
        return busy

    with ExitStack() as stack:
        for owner, name, part in CLOCKED:
            stack.enter_context(patch.object(owner, name, timed(part, getattr(owner, name))))
        stack.enter_context(patch.object(Engine, "step", step))
        yield steps


def where_rows(tmp: Path, num_prompts: int = 32, rounds: int = 5, quick: bool = False) -> list[str]:
    """Per-step milliseconds of each adapter count, the counts' runs taken in turns (quick:
    the tiny model's 0 and 4 adapters, one round)."""
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

        def clocked_run(world, items, count, runs=runs):
            """loraserve_run, keeping the median of each column of its timed decode steps."""
            with clocked(num_prompts) as steps:
                result = loraserve_run(world, items, count)
            assert steps, "no decode step of the timed window was seen"
            runs[count].append([statistics.median(column) for column in zip(*steps)])
            return result

        workloads = {count: workload(num_prompts, names[:count]) for count in model_counts}
        side_by_side(world, workloads, repeats=rounds, hf_peer=False, run=clocked_run)
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
