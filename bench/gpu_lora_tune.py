"""Tunes the Triton LoRA kernels' launch configurations on this GPU: kernels/tuned/<GPU>.json.

    python -m bench.gpu_lora_tune            # on a CUDA machine, a few minutes
    python -m bench.gpu_lora_tune --dry-run  # tiny shapes, Triton interpreted: checks the script

Each token bucket of kernels/lora_tuning.py gets the cases a step of that size meets: the
fused projections (q/k/v, o, gate/up, down) of a 1B- and an 8B-shaped model, rank-16
adapters. Decode batches are laid out as the CUDA graphs lay them out (one adapter per row,
segments padded to the batch); prefill batches share 64 adapters. A candidate's time is the
GPU time of a graph replaying its launches over 8 slabs in turn (weights come from HBM, as
a model's 16-32 layers bring them, not from L2); a config's score is its total over the
bucket's cases. Per bucket, from the defaults, each field in turn takes its best value
given the others: first the shrink's, timed with the expand that reads its split parts (a
split more costs the expand a load), then the expand's, fed by the shrink's winner's parts.
The table compares each winner with the defaults; a shrink row's times include its expand.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernels import build_segments, lora_tuning
from kernels.lora_tuning import ExpandConfig, ShrinkConfig
from kernels.segments import Segments

RANK, SLABS, REPEATS = 16, 8, 8
DEADLINE_S = 150  # buckets not begun by then keep what the file had (else the defaults)
MODELS = {  # hidden, intermediate, kv width
    "1b": (2048, 8192, 512),
    "8b": (4096, 14336, 1024),
}
# bucket: (model, tokens, adapters, graph-padded); graph-padded decode has one token per
# adapter and segments as long as the batch.
CASES = {
    "16": [("1b", 4, 4, True), ("1b", 16, 16, True), ("8b", 16, 16, True)],
    "64": [("1b", 32, 32, True), ("1b", 64, 64, True), ("8b", 32, 32, True)],
    "256": [("1b", 256, 64, False), ("8b", 256, 64, False)],
    "large": [("8b", 2048, 64, False)],
}


@dataclasses.dataclass(frozen=True)
class Case:
    x: torch.Tensor  # [T, hidden]
    slabs: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]  # (A's, B's) each
    y: torch.Tensor  # [T, sum(widths)]
    segments: Segments
    scales: torch.Tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--out", type=Path, help="where to write (default: the GPU's file)")
    parser.add_argument("--ops", default="shrink,expand", help="which kernels to tune")
    args = parser.parse_args()
    if args.dry_run:  # before the kernels' modules are imported (the timers import them)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("bench/gpu_lora_tune.py: no CUDA device; use --dry-run on a CPU")
    device = "cpu" if args.dry_run else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    out = args.out or (lora_tuning.file_for(name) if device == "cuda" else None)
    if out is None:
        out = Path(tempfile.mkdtemp()) / "tuned.json"
    ops = args.ops.split(",")
    if not set(ops) <= {"shrink", "expand"}:
        raise SystemExit(f"--ops: expected shrink and/or expand, got {args.ops}")
    # The file's entries for the ops not tuned now stay as they are (and feed this run).
    result = json.loads(out.read_text()) if out.is_file() else {}
    for op in ("shrink", "expand", "measured"):
        result.setdefault(op, {})
    result["measured"]["device"] = name
    start = time.monotonic()
    print(f"device: {name}; torch {torch.__version__}; tuning {', '.join(ops)}\n")
    print("| bucket | op | default us | tuned us | tuned / default | config |")
    print("|---|---|---:|---:|---:|---|")
    for key, specs in CASES.items():
        if time.monotonic() - start > DEADLINE_S:  # a bucket takes 30-60 s on an H200
            print(f"(deadline: bucket {key} and later keep what the file had)")
            break
        projections = (0, 3) if args.dry_run else range(4)  # the dry run: q/k/v and down
        cases = [_case(spec, i, device, args.dry_run) for spec in specs for i in projections]
        shrink = ShrinkConfig(**result["shrink"].get(key, {}))
        if "shrink" in ops:
            expand = ExpandConfig(**result["expand"].get(key, {}))
            timers = [_shrink_timer(c, expand) for c in cases]
            axes = DRY_AXES[ShrinkConfig] if args.dry_run else SHRINK_AXES
            shrink = _tuned(result, key, "shrink", _descend(ShrinkConfig, axes, timers))
        if "expand" in ops:
            timers = [_expand_timer(c, shrink) for c in cases]
            axes = DRY_AXES[ExpandConfig] if args.dry_run else EXPAND_AXES
            _tuned(result, key, "expand", _descend(ExpandConfig, axes, timers))
        del cases
        # Written after each bucket: a run cut short keeps the buckets it finished.
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    lora_tuning.clear_cache()
    print(f"\nwrote {out} in {time.monotonic() - start:.0f} s")


def _tuned(result: dict, key: str, op: str, best: tuple[object, float, float]):
    """Records and prints the winner of op in bucket key; returns it."""
    cfg, default, tuned = best
    result[op][key] = dataclasses.asdict(cfg)
    measured = {"default_us": round(default * 1e6, 1), "tuned_us": round(tuned * 1e6, 1)}
    result["measured"].setdefault(key, {})[op] = measured
    print(f"| {key} | {op} | {default * 1e6:.1f} | {tuned * 1e6:.1f} | {tuned / default:.2f}x | "
          f"{_describe(cfg)} |", flush=True)  # fmt: skip
    return cfg


# The values each field is tried at, field by field (coordinate descent from the defaults):
# about 15 timings per op and bucket, where every combination would be thousands.
SHRINK_AXES = {
    "block_m": (16, 32, 64), "block_k": (32, 64, 128, 256), "num_warps": (1, 2, 4, 8),
    "num_stages": (2, 3, 4), "programs_per_sm": (2, 4, 8, 16),
}  # fmt: skip
EXPAND_AXES = {
    "block_m": (16, 32, 64), "block_n": (64, 128, 256), "num_warps": (1, 2, 4, 8),
    "num_stages": (2, 3, 4), "n_chunks": (1, 2, 4),
}  # fmt: skip
DRY_AXES = {
    ShrinkConfig: {"block_k": (32, 64), "num_warps": (2, 4)},
    ExpandConfig: {"block_n": (32, 128), "n_chunks": (1, 2)},
}


def _descend(kind, axes: dict, timers: list[Callable]) -> tuple[object, float, float]:
    """(the fastest config found, the default's total seconds over the timers, its total):
    each field in turn set to its fastest value given the others, starting from the
    defaults, each config timed once."""
    seen: dict[object, float] = {}

    def total(cfg) -> float:
        if cfg not in seen:
            seen[cfg] = sum(_guarded(timer, cfg) for timer in timers)
        return seen[cfg]

    best = kind()
    for field, values in axes.items():
        for value in values:
            candidate = dataclasses.replace(best, **{field: value})
            if total(candidate) < total(best):
                best = candidate
    return best, total(kind()), total(best)


def _guarded(timer, cfg) -> float:
    """timer(cfg), or infinity where the candidate fails to build or run (it then loses)."""
    try:
        return timer(cfg)
    except Exception as exc:  # one candidate's failure must not end the tuning
        print(f"({_describe(cfg)}: {type(exc).__name__}: {str(exc)[:200]})", file=sys.stderr)
        return float("inf")


def _shrink_timer(case: Case, expand: ExpandConfig) -> Callable[[ShrinkConfig], float]:
    """Timing the shrink with the expand that reads its parts: the split count a shrink
    config sets (block_k, programs_per_sm) costs the expand a load per split."""
    from kernels.lora_expand_triton import lora_expand_triton
    from kernels.lora_shrink_triton import lora_shrink_parts

    def timer(cfg: ShrinkConfig) -> float:
        turn = itertools.cycle(case.slabs)

        def run():
            a, b = next(turn)
            parts = lora_shrink_parts(case.x, a, case.segments, config=cfg)
            lora_expand_triton(parts, b, case.y, case.segments, case.scales, config=expand)

        return _gpu_seconds(run, case.x.device)

    return timer


def _expand_timer(case: Case, shrink: ShrinkConfig) -> Callable[[ExpandConfig], float]:
    """Timing the expand on the parts the winning shrink leaves, one set per slab."""
    from kernels.lora_expand_triton import lora_expand_triton
    from kernels.lora_shrink_triton import lora_shrink_parts

    fed = [(b, lora_shrink_parts(case.x, a, case.segments, config=shrink)) for a, b in case.slabs]

    def timer(cfg: ExpandConfig) -> float:
        turn = itertools.cycle(fed)

        def run():
            b, parts = next(turn)
            lora_expand_triton(parts, b, case.y, case.segments, case.scales, config=cfg)

        return _gpu_seconds(run, case.x.device)

    return timer


def _gpu_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds per call of fn: on CUDA the median replay of a graph of REPEATS calls."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            fn()
    graph.replay()
    samples = []
    for _ in range(7):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / 1e3 / REPEATS)
    return statistics.median(samples)


def _case(spec, projection: int, device: str, dry_run: bool) -> Case:
    """One projection (0 q/k/v, 1 o, 2 gate/up, 3 down) of the model at spec's batch."""
    model, tokens, adapters, padded = spec
    hidden, inter, kv = (64, 96, 32) if dry_run else MODELS[model]
    tokens, adapters = (min(tokens, 8), min(adapters, 4)) if dry_run else (tokens, adapters)
    dtype = torch.float32 if dry_run else torch.bfloat16
    gen = torch.Generator().manual_seed(tokens + projection)
    fan_in, widths = [(hidden, (hidden, kv, kv)), (hidden, (hidden,)), (hidden, (inter, inter)),
                      (inter, (hidden,))][projection]  # fmt: skip
    slabs = [
        (tuple((torch.randn(adapters, RANK, fan_in, generator=gen) / 64).to(dtype).to(device)
               for _ in widths),
         tuple((torch.randn(adapters, RANK, w, generator=gen) / 4).to(dtype).to(device)
               for w in widths))
        for _ in range(2 if dry_run else SLABS)
    ]  # fmt: skip
    slots = (torch.arange(tokens) % adapters).to(torch.int32).to(device)
    ranks = torch.full((adapters,), RANK, dtype=torch.int32, device=device)
    segments = build_segments(slots, ranks)
    if padded:  # as DecodeGraphs sizes the grids: a segment per row, each up to all of them
        segments = dataclasses.replace(segments, max_segment_len=tokens)
    x = torch.randn(tokens, fan_in, generator=gen).to(dtype).to(device)
    y = torch.zeros(tokens, sum(widths), dtype=dtype, device=device)
    return Case(x, slabs, y, segments, torch.ones(adapters, device=device))


def _describe(cfg) -> str:
    return ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cfg).items())


if __name__ == "__main__":
    main()
