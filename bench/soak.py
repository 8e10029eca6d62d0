"""A soak of `loraserve serve`: many streaming clients for a fixed time, errors and memory watched.

    python -m bench.soak            # 64 clients for 60 s, memory compared over 10 s windows
    python -m bench.soak --short    # 8 clients for 6 s, 2 s windows: the CI smoke run

The server is bench/serve.py's `loraserve` row (`loraserve serve`: one ModelServer replica
listening on the port itself, on the demo kit, fp32, greedy, no speculative decoding), started on a free loopback port, warmed up on every adapter, then driven
closed-loop: each client streams a /v1/completions request (bench/load.py's prompts,
adapters round-robin over base, upper, comment and rot13, 64 tokens) and sends the next as
soon as it ends, until the time is up; requests in flight then finish and count. Resident memory is sampled once a
second over the server's whole process tree (the `loraserve serve` driver, Ray's GCS,
raylet and agents, the Serve controller and the deployments' replicas) and, apart, over the ModelServer
replicas alone; growth is the mean of the last window over the mean of the first. The
targets: zero errors and growth under 10%; the run exits 1 when it misses one (the short
run checks errors only: a few seconds are too few for memory to settle).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.load import PROMPTS, Record, stream_request, summarize
from bench.process_cpu import REPLICA, pids_by_role
from bench.servers import MODELS, ROOT, start_loraserve

GROWTH_TARGET = 0.10  # resident memory, last window over first
PAGE = os.sysconf("SC_PAGE_SIZE")


def _log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class MemorySampler:
    """RSS of a process tree, and of its replicas apart, sampled each second on a thread."""

    root: int
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, tree, replicas)
    processes: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            by_role = pids_by_role(self.root, "loraserve")  # the rule bench/serve.py counts by
            pids = [pid for role_pids in by_role.values() for pid in role_pids]
            tree = sum(rss_bytes(p) for p in pids)
            replicas = sum(rss_bytes(p) for p in by_role.get(REPLICA, ()))
            self.samples.append((time.perf_counter() - self._t0, tree, replicas))
            self.processes = len(pids)
            if self._stop.wait(1.0):
                return

    def growth(self, window: float) -> dict[str, tuple[float, float, float]]:
        """{what: (first window's mean MiB, last window's mean MiB, growth)}."""
        end = self.samples[-1][0]
        first = [s for s in self.samples if s[0] <= window]
        last = [s for s in self.samples if s[0] >= end - window]
        out = {}
        for name, col in (("tree", 1), ("replicas", 2)):
            a = sum(s[col] for s in first) / len(first) / 2**20
            b = sum(s[col] for s in last) / len(last) / 2**20
            out[name] = (a, b, b / a - 1 if a else 0.0)
        return out


async def soak(url: str, clients: int, seconds: float, max_tokens: int) -> tuple[list, float]:
    """Closed-loop streams until `seconds` have passed; the records and the wall seconds."""
    extra = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True}}  # fmt: skip
    records: list[Record] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300.0, limits=limits) as client:
        t0 = time.perf_counter()

        async def one_client(k: int) -> None:
            n = 0
            while time.perf_counter() - t0 < seconds:
                i = k + n * clients  # every client walks its own share of prompts and models
                body = {"prompt": PROMPTS[i % len(PROMPTS)], "model": MODELS[i % len(MODELS)]}
                records.append(await stream_request(client, url, i, {**body, **extra}))
                n += 1

        await asyncio.gather(*(one_client(k) for k in range(clients)))
        return records, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="8 clients, 6 s, 2 s windows, 16 tokens")
    ap.add_argument("--clients", type=int, default=None, help="default: 64 (8 with --short)")
    ap.add_argument("--seconds", type=float, default=None, help="default: 60 (6 with --short)")
    ap.add_argument("--window", type=float, default=None, help="default: 10 s (2 with --short)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 64 (16 with --short)")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to start")
    args = ap.parse_args(argv)
    clients = args.clients or (8 if args.short else 64)
    seconds = args.seconds or (6.0 if args.short else 60.0)
    window = args.window or (2.0 if args.short else 10.0)
    max_tokens = args.max_tokens or (16 if args.short else 64)
    from bench.timing import machine

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        server = start_loraserve(Path(tmp), max_num_seqs=clients)
        try:
            _log(f"ready in {server.wait_ready(args.ready_timeout):.0f} s")
            # Warm-up: each adapter once, so its load is not counted as growth or TTFT.
            warm, _ = asyncio.run(soak(server.url, len(MODELS), 0.1, 8))
            if any(r.error for r in warm):
                raise RuntimeError(f"warm-up failed: {next(r.error for r in warm if r.error)}")
            sampler = MemorySampler(server.proc.pid)
            sampler.start()
            records, wall = asyncio.run(soak(server.url, clients, seconds, max_tokens))
            sampler.stop()
        finally:
            server.stop()
    s, memory = summarize(records, wall), sampler.growth(window)
    print(f"Machine: {machine()}")
    print(f"Command: python -m bench.soak {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"loraserve {head or '?'}; demo kit (fp32), greedy, {max_tokens} tokens a request, "
          f"adapters round-robin over {', '.join(MODELS)}; {clients} streaming clients for "
          f"{seconds:.0f} s, requests in flight then finished\n")  # fmt: skip
    print("| clients | seconds | requests | errors | output tokens | tok/s | TTFT p50 ms "
          "| TTFT p99 ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    print(f"| {clients} | {wall:.1f} | {s['requests']} | {s['errors']} | {s['output_tokens']} "
          f"| {s['tok_s']:.0f} | {s['ttft_p50_ms'] or 0:.0f} | {s['ttft_p99_ms'] or 0:.0f} |\n")  # fmt: skip
    print(f"| resident memory | first {window:.0f} s, MiB | last {window:.0f} s, MiB | growth |")
    print("|---|---:|---:|---:|")
    what = {"tree": f"server process tree ({sampler.processes} processes)",
            "replicas": "ModelServer replica"}  # fmt: skip
    for name, (a, b, g) in memory.items():
        print(f"| {what[name]} | {a:.0f} | {b:.0f} | {g:+.1%} |")
    missed = []
    if s["errors"]:
        missed.append(f"{s['errors']} errors; first: {s['first_error']}")
    grown = max(g for _, _, g in memory.values())
    if not args.short and grown >= GROWTH_TARGET:
        missed.append(f"resident memory grew {grown:.1%} (target < {GROWTH_TARGET:.0%})")
    for line in missed:
        print(f"\nmissed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
