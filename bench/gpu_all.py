"""Every CUDA check in one run (at most 10 minutes), printing one table.

    python -m bench.gpu_all              # on a CUDA machine
    python -m bench.gpu_all --dry-run    # tiny shapes on the CPU, Triton interpreted: checks the script

Rows:
  correctness  the Triton LoRA kernels (bf16, fp16) and the FP8 linear against float64 references
  lora apply   Triton shrink + expand on decode/prefill shapes, 64 adapters of rank 16, against
               the bandwidth floor (x, each adapter's A and B once, y at the device copy bandwidth)
               and against a dense bf16 matmul of the same FLOPs (target: <= 1.5x floor on decode)
  fp8 linear   fp8_linear against a bf16 matmul of the same shape: decode sizes (the
               weight-streaming kernel, target <= 0.65x) and prefill sizes (torch._scaled_mm)
  decode step  an 8B-shaped model (random weights), FP8 against bf16, batch 1-32 (target <= 0.65x)
  cuda graphs  a 1B-shaped FP8 decode step replayed from CUDA graphs against eager, batch 1-32,
               and 32 adapters against base-only with graphs (target >= 0.85x throughput)
  speculative  verifying k + 1 rows against one decode step, and the 1B draft's cost ratio c
  engine       the demo kit served by the engine on CUDA equals the CPU's greedy tokens
  structured   constrained decoding on the device against free (batch 32), outputs validated
  family       Qwen3, Phi-3 (fused linears), Gemma 2 and 3 and Qwen3-MoE (grouped expert
               kernels) with an adapter per row, windows slid: fp32, bf16 and FP8 logits on
               the device against the CPU's fp32
  pytest -m gpu   the test suite's CUDA tests
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback

import torch

DEADLINE_S = 540
# (module, function) per section, imported when it runs: a package one section needs and the
# machine lacks fails that section's row, not the run.
SECTIONS = (
    ("bench.gpu_checks", "correctness_rows"), ("bench.gpu_checks", "lora_rows"),
    ("bench.gpu_checks", "fp8_rows"), ("bench.gpu_model", "model_rows"),
    ("bench.gpu_graphs", "graph_rows"), ("bench.gpu_spec", "spec_rows"),
    ("bench.gpu_engine", "engine_rows"), ("bench.gpu_structured", "structured_rows"),
    ("bench.gpu_families", "family_rows"),
)  # fmt: skip
GPU_TESTS = (
    "tests/kernels/test_lora_triton.py",
    "tests/kernels/test_paged_attention.py",
    "tests/kernels/test_paged_attention_window.py",
    "tests/kernels/test_fp8.py",
    "tests/kernels/test_fp8_small_m.py",
    "tests/kernels/test_fp8_block.py",
    "tests/kernels/test_fp8_rowwise.py",
    "tests/kernels/test_fp8_fbgemm.py",
    "tests/kernels/test_expert_linear.py",
    "tests/serving/model/test_graphs_gpu.py",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny shapes on the CPU (interpreter)"
    )
    parser.add_argument(
        "--only", help="comma-separated sections to run (correctness, lora, fp8, model, graph, "
        "spec, engine, structured, family); the tests still run"
    )  # fmt: skip
    args = parser.parse_args()
    sections = SECTIONS
    if args.only:
        wanted = set(args.only.split(","))
        sections = tuple(s for s in SECTIONS if s[1].removesuffix("_rows") in wanted)
        if len(sections) != len(wanted):
            sys.exit(f"--only: unknown section in {args.only}")
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        sys.exit("bench/gpu_all.py: no CUDA device; use --dry-run to check the script on a CPU")
    device = "cpu" if args.dry_run else "cuda"
    start = time.monotonic()

    print(
        f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (dry run)'}; torch {torch.__version__}"
    )
    print(f"LoRA launch configs: {_lora_configs(device)}\n")
    print("| check | shape | result | ratio | target | ok |")
    print("|---|---|---|---:|---|:-:|")
    failed = total = 0
    for section in sections:
        # Print each section as it lands: a timeout or a crash later keeps what ran before.
        for row in _guarded(section, device, args.dry_run):
            total += 1
            failed += row[-1] == "no"
            print("| " + " | ".join(row) + " |", flush=True)
    if not args.dry_run and time.monotonic() - start < DEADLINE_S - 120:
        row = _pytest_gpu_row()
        total += 1
        failed += row[-1] == "no"
        print("| " + " | ".join(row) + " |", flush=True)
    print(f"\n{total} checks, {failed} missed, {time.monotonic() - start:.0f} s")


def _guarded(section: tuple[str, str], device: str, dry_run: bool) -> list[tuple[str, ...]]:
    """The section's rows, or one failed row naming its exception: one fault loses one section."""
    module, name = section
    try:
        return list(getattr(importlib.import_module(module), name)(device, dry_run))
    except Exception as exc:  # reported as a row: the run goes on
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")[:160]
        return [(name.removesuffix("_rows"), "-", message, "-", "runs", "no")]


def _lora_configs(device: str) -> str:
    """The tuned table the LoRA kernels read here (bench/gpu_lora_tune.py writes it)."""
    if device != "cuda":
        return "defaults (interpreter)"
    from kernels.lora_tuning import table_path

    path, _ = table_path()
    return str(path) if path.is_file() else "defaults (no tuned table for this GPU)"


def _pytest_gpu_row() -> tuple[str, ...]:
    done = subprocess.run(
        # The files holding the CUDA tests: the rest of the suite needs the serving stack.
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *GPU_TESTS],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = done.stdout.strip().splitlines() or ["(no output)"]
    if done.returncode != 0:  # the failures' short summary and the tracebacks, for the log
        print(done.stdout[-20000:], done.stderr[-4000:], sep="\n", file=sys.stderr, flush=True)
    last = lines[-1]
    return (
        "pytest -m gpu",
        "tests/",
        last,
        "",
        "all pass",
        "yes" if done.returncode == 0 else "no",
    )


if __name__ == "__main__":
    main()
