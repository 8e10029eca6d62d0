"""A soak of loraserve: many streaming clients for a fixed time, errors and resident memory watched.

    python -m bench.soak --seconds 600               # `loraserve serve`, 64 clients, the demo kit
    python -m bench.soak --seconds 600 --local       # the one-process server instead
    python -m bench.soak --seconds 600 --adapters 200 --batch   # 200 adapters, a batch running
    python -m bench.soak                             # 60 s, memory compared over 10 s windows
    python -m bench.soak --short                     # 8 clients for 6 s, 2 s windows: CI's run

The server is bench/serve.py's `loraserve` row (`loraserve serve`: one ModelServer replica
listening on the port itself, on the demo kit, fp32, greedy, no speculative decoding), or with
--local its `loraserve-local` row (bench/peers/local_server.py: the same app and engine in one
process), started on a free loopback port, warmed up on every model it will serve, then driven
closed-loop by bench/soak_load.py: each client streams a /v1/completions request (64 tokens,
models round robin) and sends the next as soon as it ends, until the time is up; requests in
flight then finish and count. The models are the base and the demo's upper, comment and rot13,
or with --adapters N, N distinct copies of those three (perturbed weights, names soak-0000...)
published as lora.preload, on a slab (lora.slab_mb) sized for about half of them: 100 of 200
at once (66 MiB of fp32 pages), so nearly every request loads its adapter into the slab (from
the host tier, which holds them all) and evicts the least recently used one. With --batch an
OpenAI batch (/v1/files + /v1/batches, --batch-items completions over the same models) runs
beside the streams, submitted again each time one completes; the one running at the end is
cancelled, its finished items kept.

Resident memory (bench/soak_memory.py) is sampled once a second over the server's whole process
tree (for `loraserve serve` the driver, Ray's GCS, raylet and agents, the Serve controller and
the replicas; for --local the server process and any grammar compile processes) and, apart,
over the process that runs the model (the ModelServer replica, or the one server process). The
baseline is the mean over --window seconds from --settle seconds after the load starts, the
comparison the mean over the last --window seconds; runs of 300 s and more default to a 60 s
settle and 60 s windows, shorter runs to the first window against the last. Growth is the ratio
of the two, and KB/request the change over the streamed requests served between the two
windows' midpoints. The targets: zero errors (batch items too) and growth under 10%; the run
exits 1 when it misses one (--short checks errors only: a few seconds are too few for memory to
settle). The run prints one table row (requests, errors, tok/s, each RSS as baseline -> last
with its growth and KB/request, batch items), naming its command and commit, for
bench/README.md's soak section.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.load import run_load, summarize, workload
from bench.servers import ADAPTERS, DEMO, MODELS, ROOT, start_loraserve
from bench.soak_load import adapter_copies, batches, slab_for, streams
from bench.soak_memory import MemorySampler, growth

GROWTH_TARGET = 0.10  # resident memory, last window over the baseline window
LONG_RUN_S = 300  # runs this long let memory settle before the baseline: 60 s, 60 s windows


def _log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="8 clients, 6 s, 2 s windows, 16 tokens")
    ap.add_argument("--clients", type=int, default=None, help="default: 64 (8 with --short)")
    ap.add_argument("--seconds", type=float, default=None, help="default: 60 (6 with --short)")
    ap.add_argument("--window", type=float, default=None,
                    help="default: 60 s for runs of 300 s and more, else 10 (2 with --short)")  # fmt: skip
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds before the baseline window; default: 60 from 300 s up, else 0")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 64 (16 with --short)")
    ap.add_argument("--local", action="store_true", help="the one-process server, not Ray's")
    ap.add_argument("--adapters", type=int, default=0, metavar="N",
                    help="N distinct adapters in rotation, on a slab for about half of them")  # fmt: skip
    ap.add_argument("--batch", action="store_true", help="OpenAI batches run beside the streams")
    ap.add_argument("--batch-items", type=int, default=None,
                    help="lines per batch; default: 256 (32 with --short)")  # fmt: skip
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to start")
    args = ap.parse_args(argv)

    def default(value, short, full):  # None: not given; a 0 given stays 0, and is refused
        return value if value is not None else short if args.short else full

    args.clients = default(args.clients, 8, 64)
    args.seconds = default(args.seconds, 6.0, 60.0)
    args.max_tokens = default(args.max_tokens, 16, 64)
    args.batch_items = default(args.batch_items, 32, 256)
    if min(args.clients, args.seconds, args.max_tokens, args.batch_items) <= 0:
        ap.error("--clients, --seconds, --max-tokens and --batch-items must be positive")
    if (
        args.adapters < 0
        or (args.settle or 0) < 0
        or (args.window is not None and args.window <= 0)
    ):
        ap.error("--adapters and --settle must not be negative, --window must be positive")
    long = args.seconds >= LONG_RUN_S
    if args.window is None:
        args.window = 60.0 if long else 2.0 if args.short else 10.0
    args.settle = args.settle if args.settle is not None else 60.0 if long else 0.0
    if args.settle + 2 * args.window > args.seconds:
        ap.error(f"--settle {args.settle:g} s and two --window {args.window:g} s windows do not "
                 f"fit in --seconds {args.seconds:g}; shorten them or soak longer")  # fmt: skip
    return args


async def load(url: str, args, models: list[str], sampler: MemorySampler):
    """The streams, and the batches beside them, with memory sampled meanwhile: the streams'
    records, when each ended, the wall seconds, and the batches' tally (None without --batch)."""
    stop = asyncio.Event()
    job = None
    if args.batch:
        job = asyncio.create_task(batches(url, models, args.batch_items, args.max_tokens, stop))
    sampler.start()
    try:
        records, ends, wall = await streams(url, args.clients, args.seconds, args.max_tokens,
                                            models)  # fmt: skip
    finally:
        sampler.stop()
        stop.set()  # the running batch is cancelled, its finished items kept
    return records, ends, wall, (await job if job else None)


def soak(args, tmp: Path) -> dict:
    """Start the server, warm it up, soak it; what the report shows."""
    from bench.fleet_server import counters, slab_figures

    lora, models = {}, MODELS
    if args.adapters:
        copies = {k: str(v) for k, v in adapter_copies(tmp / "adapters", args.adapters).items()}
        slab_mb, held = slab_for(args.adapters)
        demo = {name: str(DEMO / "adapters" / name) for name in ADAPTERS}
        lora, models = {"slab_mb": slab_mb, "preload": {**demo, **copies}}, list(copies)
        _log(f"{args.adapters} adapters; lora.slab_mb {slab_mb} holds about {held} of them")
    server = start_loraserve(tmp, max_num_seqs=args.clients, local=args.local, lora=lora)
    try:
        _log(f"ready in {server.wait_ready(args.ready_timeout):.0f} s")
        # Warm-up: each model once, so that its first load is not counted as growth.
        warm, _ = run_load(server.url, workload(len(models), models),
                           min(args.clients, len(models)), max_tokens=8)  # fmt: skip
        if any(r.error for r in warm):
            raise RuntimeError(f"warm-up failed: {next(r.error for r in warm if r.error)}")
        sampler = MemorySampler(server.proc.pid, server.kind)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            before = counters(client)
            records, ends, wall, tally = asyncio.run(load(server.url, args, models, sampler))
            after = counters(client)
            slab = slab_figures(client, set(models))
    finally:
        server.stop()
    served = [end for r, end in zip(records, ends, strict=True) if r.error is None]
    return {"summary": summarize(records, wall), "growth": growth(sampler, served, args.settle,
            args.window), "tally": tally, "processes": sampler.processes, "slab": slab,
            "paging": {k: after[k] - before[k] for k in after}, "models": len(models)}  # fmt: skip


def report(args, argv: list[str], run: dict) -> list[str]:
    """Print the run's row and notes; the targets it missed."""
    from bench.timing import machine

    s, g, tally = run["summary"], run["growth"], run["tally"]
    head = run["commit"]
    command = " ".join(["python -m bench.soak", *argv])
    batch = f"{tally.items_done} done, {tally.items_failed} failed" if tally else "-"
    server = "the one-process server" if args.local else "`loraserve serve`"
    models = f"{args.adapters} adapters" if args.adapters else ", ".join(MODELS)
    print(f"Machine: {machine()}")
    print(f"Command: {command}")
    print(f"{server} at {head}; demo kit (fp32), greedy, {args.max_tokens} tokens a request, "
          f"models round robin over {models}; {args.clients} streaming clients for "
          f"{args.seconds:.0f} s, requests in flight then finished; RSS windows {g.spans}\n")  # fmt: skip
    print("| command | commit | requests | errors | tok/s | replica RSS, MiB | replica KB/request "
          "| tree RSS, MiB | tree KB/request | batch items |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    print(f"| `{command}` | {head} | {s['requests']} | {s['errors']} | {s['tok_s']:.0f} "
          f"| {g.cell('replica')} | {g.kb_per_request('replica')} | {g.cell('tree')} "
          f"| {g.kb_per_request('tree')} | {batch} |\n")  # fmt: skip
    print(f"TTFT p50 {s['ttft_p50_ms'] or 0:.0f} ms, p99 {s['ttft_p99_ms'] or 0:.0f} ms; "
          f"{s['output_tokens']} tokens in {s['seconds']:.1f} s; the tree: {run['processes']} "
          f"processes; KB/request over the {g.served} requests served between the windows' "
          f"midpoints")  # fmt: skip
    if args.adapters:
        slab, paging = run["slab"], run["paging"]
        print(f"slab: {slab.get('resident', 0)} adapters resident of {slab.get('slots', 0)} "
              f"slots at the end; {paging['loads']:.0f} loads and {paging['evictions']:.0f} "
              f"evictions during the soak")  # fmt: skip
    if tally:
        print(f"batches: {tally.describe()}")
    missed = []
    if s["errors"]:
        missed.append(f"{s['errors']} errors; first: {s['first_error']}")
    if tally and (tally.items_failed or tally.error):
        missed.append(f"batch: {tally.describe()}")
    grown = max(g.ratio("tree"), g.ratio("replica"))
    if not args.short and grown >= GROWTH_TARGET:
        missed.append(f"resident memory grew {grown:.1%} (target < {GROWTH_TARGET:.0%})")
    for line in missed:
        print(f"\nmissed: {line}")
    return missed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        # the commit the server starts from, read now: a run is long, and the tree may move
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or "?"  # fmt: skip
        run = {**soak(args, Path(tmp)), "commit": commit}
    return 1 if report(args, argv, run) else 0


if __name__ == "__main__":
    sys.exit(main())
