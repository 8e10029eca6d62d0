"""Speculative decoding on the demo kit: speed-up over plain decoding, side by side (CPU).

    python -m bench.spec [--quick] [--batches 1 4 16] [--reps 3]

Two workloads, each at several batch sizes (that many requests at once, greedy, 64 tokens):
  code        completions of Python code under the kit's draft model (k = 4, fixed)
  repetitive  RAG style: the prompt holds a function from the standard library, then its
              first lines again; its continuation is in the prompt, where prompt lookup
              (n-gram, k = 4) finds it
Per row: tokens/s without and with speculation (fresh engines, interleaved runs, median),
acceptance a, tokens per verification, the draft's cost c per draft step relative to a
plain decode step (measured), the theory's speed-up (1 - a^(k+1)) / (1 - a) / (k c + 1)
and realized over theory. The `auto` rows use the default settings (adaptive k, and
speculation off above draft.max_batch_size running sequences).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import textwrap
import time
from pathlib import Path

import torch

from bench.timing import machine
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.engine.speculative.adaptive import expected_tokens
from serving.engine.speculative.config import SpecConfig
from serving.model.loader import load_model

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
K = 4
CODE_PROMPTS = ["def read_lines(path):\n", "class Counter:\n", "def parse_args(argv):\n",
                "import os\n\n\ndef walk(top):\n", "def merge(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
                "def __repr__(self):\n", "    def close(self):\n", "def split_words(text):\n"]  # fmt: skip


def repetitive_prompts(max_chars: int = 1200) -> list[str]:
    """A function from the standard library, then its first three lines again to continue."""
    import json
    import shlex
    import textwrap as tw

    sources = [inspect.getsource(f) for f in (tw.indent, shlex.quote, json.dumps, tw.dedent)]
    out = []
    for src in sources:
        src = textwrap.dedent(src)[:max_chars]
        head = "\n".join(src.splitlines()[:3])
        out.append(f"{src}\n\n{head}\n")
    return out


def run_once(model, draft, tok, prompts: list[list[int]], spec: SpecConfig, new_tokens: int):
    """(seconds, tokens, engine steps, spec stats) of all prompts served at once."""
    config = EngineConfig(max_model_len=2048, num_blocks=1024, block_size=16, speculative=spec,
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096))  # fmt: skip
    engine = Engine(model, tok, config, draft_model=draft)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.submit(GenerateRequest(f"r{i}", tuple(p), params), lambda out: None)
    steps, start = 0, time.perf_counter()
    while engine.step():
        steps += 1
    seconds = time.perf_counter() - start
    return seconds, len(prompts) * new_tokens, steps, engine.spec.stats if engine.spec else None


def measure(
    model, draft, tok, prompts, method: str, batch: int, reps: int, new_tokens: int
) -> dict:
    batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
    configs = {
        "none": SpecConfig(),
        "fixed": SpecConfig(
            method=method, num_speculative_tokens=K, adaptive=False, max_batch_size=0
        ),
        "auto": SpecConfig(method=method, num_speculative_tokens=K),
    }
    runs: dict[str, list] = {name: [] for name in configs}
    for _ in range(reps):  # interleaved, so all see the same machine
        for name, spec in configs.items():
            runs[name].append(run_once(model, draft, tok, batch_prompts, spec, new_tokens))
    tps = {n: statistics.median(r[1] / r[0] for r in rs) for n, rs in runs.items()}
    plain_step = statistics.median(r[0] / r[2] for r in runs["none"])
    stats = runs["fixed"][-1][3]
    alpha = stats.total.acceptance_rate
    rounds = stats.total.steps and K * stats.total.steps / max(batch, 1)
    c = (stats.draft_seconds / rounds / plain_step) if (method == "draft_model" and rounds) else 0.0
    theory = expected_tokens(alpha, K) / (K * c + 1)
    return {"method": method, "batch": batch, "none": tps["none"], "fixed": tps["fixed"],
            "auto": tps["auto"], "alpha": alpha, "tokens_per_step": stats.total.tokens_per_step,
            "c": c, "theory": theory}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="batch 1 and 4, 16 tokens, 1 rep")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kit", type=Path, default=DEMO, help="the demo kit's folder")
    args = ap.parse_args()
    batches, reps, new_tokens = ([1, 4], 1, 16) if args.quick else (args.batches, args.reps, 64)
    torch.set_num_threads(2)
    base = load_model(args.kit / "base", quantization="none")
    draft = load_model(args.kit / "draft", quantization="none").model
    tok = base.tokenizer
    code = [tok.encode(p) for p in CODE_PROMPTS]
    rep = [tok.encode(p) for p in repetitive_prompts(300 if args.quick else 1200)]
    rows = []
    with torch.inference_mode():
        for b in batches:
            rows.append(
                ("code", measure(base.model, draft, tok, code, "draft_model", b, reps, new_tokens))
            )
            rows.append(
                ("repetitive", measure(base.model, draft, tok, rep, "ngram", b, reps, new_tokens))
            )
    print(f"machine: {machine()}; greedy, {new_tokens} new tokens per request, k = {K}\n")
    print("| workload | proposer | batch | plain tok/s | spec tok/s (k=4) | speed-up | acceptance | "
          "tokens/step | draft cost c | theory | realized / theory | auto speed-up |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for workload, r in rows:
        speedup = r["fixed"] / r["none"]
        print(f"| {workload} | {r['method']} | {r['batch']} | {r['none']:.0f} | {r['fixed']:.0f} | "
              f"{speedup:.2f}x | {r['alpha']:.2f} | {r['tokens_per_step']:.2f} | {r['c']:.2f} | "
              f"{r['theory']:.2f}x | {speedup / r['theory']:.2f} | {r['auto'] / r['none']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
