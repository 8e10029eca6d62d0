"""Constrained decoding (structured output) on the demo kit: what the grammars cost (CPU).

    python -m bench.structured [--quick] [--batches 1 8 32] [--rounds 5] [--threads 1]
    python -m bench.structured --format tools [--batches 32]
    python -m bench.structured --libraries [--quick]

Two tables, from one run:
  decode    the demo engine serving the same chat prompts, greedy, free and under a JSON
            schema (RECORD), in interleaved rounds, medians. A constrained row ends when its
            JSON does; "free" rows run to MAX_TOKENS, "matched" rows to the length of the
            same row's constrained output, so that run has the constrained run's batch at
            every step. Tokens/s of each (target: constrained >= 0.9x free at batch 32),
            mean output length, time per step split into the model's forward and the rest
            (the engine's: scheduling, sampling, masks, emitting), and the masks' own cost
            per step, timed directly over the grammar states the constrained run went
            through: fill (grammar_masks), apply (the sampler's copy of the logits +
            TokenMasks.apply) and accept (each row's token). "mixed" runs every other row
            constrained and the rest free at their matched lengths: the cost of constrained
            rows to a batch they share, against "matched".
            --format tools: the rows are chat requests offering four functions, held to
            one call under tool_choice "required" (the chat route's structural tag).
  compile   each format's first compile on a fresh GrammarCompiler of one compile process
            (with the process's start and the vocabulary's one-time setup) and on one whose
            process is up, and a cached one.
--libraries prints instead xgrammar against llguidance (bench/structured_libraries.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench.structured_libraries import library_rows
from bench.structured_workload import (
    RECORD,
    SCHEMAS,
    prompts,
    response_format,
    tool_call_format,
    tool_prompts,
)
from bench.timing import machine
from serving.engine.engine import Engine, EngineConfig
from serving.engine.grammar.compiler import GrammarCompiler
from serving.engine.grammar.masks import grammar_masks
from serving.engine.grammar.matcher import RowGrammar
from serving.engine.request import GenerateRequest, ResponseFormat, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.model.loader import load_model

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
MAX_TOKENS = 224  # above every constrained output's length, so each ends with its JSON


class TimedModel:
    """The model, adding up the wall time of its forwards: the rest of a step is the engine's."""

    def __init__(self, model) -> None:
        self.model, self.seconds = model, 0.0

    def forward(self, *args):
        start = time.perf_counter()
        logits = self.model.forward(*args)
        self.seconds += time.perf_counter() - start
        return logits

    def __getattr__(self, name: str):
        return getattr(self.model, name)


def serve(engine: Engine, batch: list[list[int]], fmt, max_tokens: list[int]) -> dict:
    """All of batch served at once (request i: up to max_tokens[i] tokens, under fmt, or
    fmt[i] when fmt is a list): seconds, engine steps, seconds in the model's forward,
    each request's output tokens."""
    outputs: dict[str, list[int]] = {}
    fmts = fmt if isinstance(fmt, list) else [fmt] * len(batch)
    for i, (p, n) in enumerate(zip(batch, max_tokens, strict=True)):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        request = GenerateRequest(f"r{i}", tuple(p), params, response_format=fmts[i])
        engine.submit(
            request, lambda o: outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        )
    engine.model.seconds = 0.0
    steps, start = 0, time.perf_counter()
    while (busy := engine.step()) or engine.grammars:
        steps += busy
        if not busy:  # a grammar still compiling (warm-up only): leave its thread the core
            time.sleep(0.001)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": steps, "forward": engine.model.seconds,
            "outputs": [outputs[f"r{i}"] for i in range(len(batch))]}  # fmt: skip


def mask_seconds(compiled, outputs: list[list[int]], vocab_size: int) -> dict[str, float]:
    """The masks' time over a constrained run's steps, replayed: fill, apply, accept (seconds).

    Step j masks the rows still running then (those with more than j tokens), each at its
    grammar's state after its first j tokens, as the engine's step j did.
    """
    grammars = [RowGrammar(compiled) for _ in outputs]
    logits = torch.randn(len(outputs), vocab_size)
    spent = {"fill": 0.0, "apply": 0.0, "accept": 0.0}
    for j in range(max(map(len, outputs))):
        alive = [i for i, out in enumerate(outputs) if len(out) > j]
        t0 = time.perf_counter()
        masks = grammar_masks([grammars[i] for i in alive])
        t1 = time.perf_counter()
        masks.apply(logits[: len(alive)].clone())  # the sampler masks a copy
        t2 = time.perf_counter()
        if not all([grammars[i].accept(outputs[i][j]) for i in alive]):
            raise RuntimeError("a grammar refused a token the engine emitted under it")
        t3 = time.perf_counter()
        spent["fill"] += t1 - t0
        spent["apply"] += t2 - t1
        spent["accept"] += t3 - t2
    return spent


def decode_row(engine: Engine, batch: list[list[int]], fmt: ResponseFormat, rounds: int) -> dict:
    """Free and constrained runs of batch, alternated over rounds; medians.

    "free" rows run to MAX_TOKENS; "matched" rows stop at the length of the same row's
    constrained output, so that run has the constrained run's batch at every step (a closed
    batch shrinks as its rows finish; a server would fill the freed rows with new requests).
    """
    lengths = [len(out) for out in serve(engine, batch, fmt, [MAX_TOKENS] * len(batch))["outputs"]]
    half = [fmt if i % 2 == 0 else None for i in range(len(batch))]
    plans = {"free": (None, [MAX_TOKENS] * len(batch)), "matched": (None, lengths),
             "constrained": (fmt, [MAX_TOKENS] * len(batch)),
             "mixed": (half, [MAX_TOKENS if f else n for f, n in zip(half, lengths)])}  # fmt: skip
    runs: dict[str, list[dict]] = {name: [] for name in plans}
    for _ in range(rounds):  # interleaved, so all see the same machine
        for name, (f, max_tokens) in plans.items():
            runs[name].append(serve(engine, batch, f, max_tokens))
    row = {}
    for name, rs in runs.items():
        tokens = [sum(map(len, r["outputs"])) for r in rs]
        row[name] = statistics.median(n / r["seconds"] for n, r in zip(tokens, rs))
        row[f"{name} len"] = statistics.mean(tokens) / len(batch)
        row[f"{name} step"] = statistics.median(r["seconds"] / r["steps"] for r in rs)
        row[f"{name} forward"] = statistics.median(r["forward"] / r["steps"] for r in rs)
    compiled = engine.grammars.compiler.compile_now(fmt)
    outputs = runs["constrained"][-1]["outputs"]
    replays = [mask_seconds(compiled, outputs, engine.vocab_size) for _ in range(rounds)]
    steps = max(map(len, outputs))
    for part in ("fill", "apply", "accept"):
        row[part] = statistics.median(r[part] for r in replays) / steps
    row["masks"] = row["fill"] + row["apply"] + row["accept"]
    return row


def decode_table(base, batches: list[int], rounds: int, tools: bool = False) -> list[str]:
    config = EngineConfig(max_model_len=2048, num_blocks=2048, block_size=16,
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096))  # fmt: skip
    engine = Engine(TimedModel(base.model), base.tokenizer, config)
    if tools:
        fmt, ps = tool_call_format(), tool_prompts(base.tokenizer)
    else:
        fmt, ps = response_format(RECORD), prompts(base.tokenizer)
    serve(engine, ps, None, [8] * len(ps))  # warm-up: the prompts in the prefix cache
    serve(engine, ps, fmt, [8] * len(ps))  # and the grammar compiled
    out = [f"| batch | free tok/s ({MAX_TOKENS} tokens) | matched tok/s | constrained tok/s "
           "| constrained / matched | constrained / free | constrained tokens (mean) "
           "| step ms (matched / constrained) | forward ms | rest of the step ms "
           "| masks ms/step (fill + apply + accept) | masks / constrained step "
           "| mixed tok/s | mixed / matched |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for b in batches:
        r = decode_row(engine, [ps[i % len(ps)] for i in range(b)], fmt, rounds)
        ms = {k: 1e3 * v for k, v in r.items()}  # the seconds among them, in ms
        rest = {n: ms[f"{n} step"] - ms[f"{n} forward"] for n in ("matched", "constrained")}
        out.append(
            f"| {b} | {r['free']:.0f} | {r['matched']:.0f} | {r['constrained']:.0f} "
            f"| {r['constrained'] / r['matched']:.2f}x | {r['constrained'] / r['free']:.2f}x "
            f"| {r['constrained len']:.1f} "
            f"| {ms['matched step']:.2f} / {ms['constrained step']:.2f} "
            f"| {ms['matched forward']:.2f} / {ms['constrained forward']:.2f} "
            f"| {rest['matched']:.2f} / {rest['constrained']:.2f} "
            f"| {ms['masks']:.3f} ({ms['fill']:.3f} + {ms['apply']:.3f} + {ms['accept']:.3f}) "
            f"| {r['masks'] / r['constrained step']:.1%} "
            f"| {r['mixed']:.0f} | {r['mixed'] / r['matched']:.2f}x |"
        )
    engine.shutdown()
    return out


def compile_table(tok, vocab_size: int, reps: int) -> list[str]:
    """Per format: first compile on a fresh compiler, on a set-up one, and a cache hit (ms).

    One compile process each, so that the warm-up compile has started the process the
    measured one runs in (a compile's own cost, as the server pays it once its processes are up).
    """
    warm_up = response_format({"type": "string"})  # starts the process; not measured
    out = ["| format | first compile, fresh compiler ms | first compile ms | cache hit ms "
           "| process start and vocabulary setup ms (the difference) |",
           "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, schema in {**SCHEMAS, "json_object": None}.items():
        fmt = response_format(schema)
        times: dict[str, list[float]] = {"fresh": [], "first": [], "hit": []}
        for _ in range(reps):
            fresh = GrammarCompiler(tok, vocab_size, workers=1)
            times["fresh"].append(_compile_seconds(fresh, fmt))
            ready = GrammarCompiler(tok, vocab_size, workers=1)
            ready.compile_now(warm_up)
            times["first"].append(_compile_seconds(ready, fmt))
            times["hit"].append(_compile_seconds(ready, fmt))  # submit finds it in the cache
            fresh.shutdown()
            ready.shutdown()
        ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        out.append(f"| {name} | {ms['fresh']:.1f} | {ms['first']:.1f} | {ms['hit']:.3f} "
                   f"| {ms['fresh'] - ms['first']:.1f} |")  # fmt: skip
    return out


def _compile_seconds(compiler: GrammarCompiler, fmt: ResponseFormat) -> float:
    start = time.perf_counter()
    compiler.compile_now(fmt)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="batch 1 and 8, 1 round (a smoke run)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=5, help="free/constrained rounds per row")
    ap.add_argument("--libraries", action="store_true", help="only xgrammar against llguidance")
    # 1 thread: on a shared 2-core host a second one makes each of a step's many small ops
    # wait for a core that another process holds (see bench/README.md)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    ap.add_argument("--kit", type=Path, default=DEMO, help="the demo kit's folder")
    ap.add_argument("--format", choices=["record", "tools"], default="record",
                    help="the constrained rows: RECORD, or one tool call")  # fmt: skip
    args = ap.parse_args()
    batches, rounds = ([1, 8], 1) if args.quick else (args.batches, args.rounds)
    torch.set_num_threads(args.threads)
    base = load_model(args.kit / "base", quantization="none")
    print(f"machine: {machine()}\n")
    if args.libraries:
        print("\n".join(library_rows(base.tokenizer, base.model.config.vocab_size, args.quick)))
        return
    print(f"decode ({args.format}): greedy, max_tokens {MAX_TOKENS}, medians of {rounds} "
          "interleaved rounds\n")  # fmt: skip
    with torch.inference_mode():
        table = decode_table(base, batches, rounds, args.format == "tools")
        print("\n".join(table) + "\n", flush=True)
    if args.format == "tools":
        return
    reps = 1 if args.quick else 11
    print(f"compile: medians of {reps}\n")
    print("\n".join(compile_table(base.tokenizer, base.model.config.vocab_size, reps)))


if __name__ == "__main__":
    main()
