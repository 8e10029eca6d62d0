"""The engine against its peers on one workload, side by side in one run (CPU).

    python -m bench.engine [--quick] [--no-vllm] [--variants] [--share] [--where] [--families]

Peers run in virtualenvs this script creates (.bench-venvs/), each generating the same
greedy tokens: HF transformers + PEFT (`generate(adapter_names=...)`, batches of 32) and,
unless --no-vllm, vLLM's CPU build. Also measured: 32 adapters against base-only
throughput, the engine's step time against a bare forward of the same batch, TTFT
with a 2k-token shared prefix, cold against a prefix-cache hit, and a batch mixing PEFT's
LoRA variants against a plain-LoRA batch (--variants: that table alone, no peers).
--share: 32 adapters against base-only as the adapters' share of a step's bytes varies
(bench/engine_share.py; no peers). --where: how a decode step's time splits into base
linears, LoRA ops and the rest, base-only against 4 and 32 adapters (bench/engine_where.py).
--families: a row per base family (Llama, Qwen3, Phi-3, Gemma 2, Gemma 3, Qwen3-MoE), mixed
adapters against HF+PEFT.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from bench.engine_extras import overhead_rows, ttft_rows
from bench.engine_runs import NEW_TOKENS, peer_run, side_by_side, tok_s, workload
from bench.engine_share import share_rows
from bench.engine_variants import variant_rows
from bench.engine_where import where_rows
from bench.peers.tiny_world import build
from bench.timing import machine


def fmt(x: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "-" if x is None else format(x, spec) + unit


def family_rows(root: Path) -> list[str]:
    """A row per family: 32 prompts dealt over 4 adapters, against HF+PEFT (3 rounds in turns,
    the median of each)."""
    rows = ["| family | prompts | adapters | loraserve tok/s | HF+PEFT tok/s | vs HF+PEFT "
            "| same tokens as HF |", "|---|---:|---:|---:|---:|---:|:-:|"]  # fmt: skip
    for family in ("llama", "qwen3", "phi3", "gemma2", "gemma3", "qwen3_moe"):
        world = build(root / family, num_adapters=4, family=family)
        items = workload(32, sorted(world["adapters"]))
        ours, hf = side_by_side(world, {4: items})[4]
        same = "yes" if hf and hf["outputs"] == ours["outputs"] else "no"
        ratio = tok_s(ours) / tok_s(hf) if hf else None
        rows.append(f"| {family} | 32 | 4 | {fmt(tok_s(ours))} | {fmt(tok_s(hf))} "
                    f"| {fmt(ratio, '.2f', 'x')} | {same} |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 prompts, rank 8 only")
    parser.add_argument("--no-vllm", action="store_true", help="leave the vLLM peer out")
    parser.add_argument("--variants", action="store_true", help="only the LoRA-variants table")
    parser.add_argument("--share", action="store_true", help="only the adapters' byte-share table")
    parser.add_argument("--where", action="store_true", help="only the decode step's time split")
    parser.add_argument("--families", action="store_true",
                        help="only a row per base family against HF+PEFT")  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"machine: {machine()}; greedy, {NEW_TOKENS} new tokens per prompt\n")
    if args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(variant_rows(Path(tmp), 8 if args.quick else 32)))
        return
    if args.share:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(share_rows(Path(tmp), quick=args.quick)))
        return
    if args.where:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(where_rows(Path(tmp), quick=args.quick)))
        return
    if args.families:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(family_rows(Path(tmp))))
        return
    print(
        "| model | prompts | adapters | rank | loraserve tok/s | HF+PEFT tok/s | vLLM tok/s "
        "| vs HF+PEFT | vs vLLM | same tokens as HF |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|")
    # (model, its shape, rank, prompt counts, adapter counts, with vLLM); vLLM's ~25 s start-up
    # per run bounds what fits in one run
    tiny, medium = {"num_adapters": 32}, {"num_adapters": 4, "hidden": 768, "layers": 12,
                                          "heads": 12, "kv_heads": 4, "vocab": 8192}  # fmt: skip
    plan = [("tiny (hidden 256)", tiny, 8, (32,), (0, 4, 32), True)]
    if not args.quick:
        plan = [
            ("tiny (hidden 256)", tiny, 8, (32, 128), (0, 4, 32), True),
            ("tiny (hidden 256)", tiny, 16, (32,), (0, 4, 32), False),
            ("medium (hidden 768)", medium, 8, (32,), (0, 4), True),
        ]
    with tempfile.TemporaryDirectory() as tmp:
        for label, shape, rank, sizes, counts, with_vllm in plan:
            world = build(Path(tmp) / f"{label[:4]}{rank}", rank=rank, **shape)
            names = sorted(world["adapters"])
            for num_prompts in sizes:
                workloads = {count: workload(num_prompts, names[:count]) for count in counts}
                measured = side_by_side(world, workloads)
                for count, items in workloads.items():
                    ours, hf = measured[count]
                    use_vllm = with_vllm and not args.no_vllm
                    vllm = peer_run("vllm", world, items, count) if use_vllm else None
                    same = "yes" if hf and hf["outputs"] == ours["outputs"] else "no"
                    print(
                        f"| {label} | {num_prompts} | {count} | {rank} | {fmt(tok_s(ours))} "
                        f"| {fmt(tok_s(hf))} | {fmt(tok_s(vllm))} "
                        f"| {fmt(tok_s(ours) / tok_s(hf) if hf else None, '.2f', 'x')} "
                        f"| {fmt(tok_s(ours) / tok_s(vllm) if vllm else None, '.2f', 'x')} | {same} |",
                        flush=True,
                    )
                if 32 in measured and 0 in measured:
                    ratio = tok_s(measured[32][0]) / tok_s(measured[0][0])
                    print(
                        f"|  | {num_prompts} | 32 vs 0 | {rank} | {ratio:.2f}x | | | | | |",
                        flush=True,
                    )
        print()
        for line in overhead_rows(Path(tmp)):
            print(line)
        print()
        for line in ttft_rows(Path(tmp)):
            print(line)
        print()
        for line in variant_rows(Path(tmp)):
            print(line)


if __name__ == "__main__":
    main()
