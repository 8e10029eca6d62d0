"""Thousands of adapters on one server: throughput with N distinct adapters against 8, and
how many adapters the default slab holds at once.

    python -m bench.fleet [--quick] [--rounds 3] [--adapters 1000] [--modes fleet capacity]

One server process (bench/fleet_server.py: loraserve's app and engine without Ray, on the
demo kit, speculation off, the lora section at its defaults) per measurement, on a free
loopback port, stopped with SIGINT.

fleet: N distinct rank-8 q/v adapters of the demo base model, made here with PEFT, are
uploaded over HTTP; then bench/load.py sends 256 streamed completions, 32 in flight, 64
tokens each, greedy, adapters round robin over all N (the round robin goes on from round to
round, so later rounds reach adapters earlier ones did not), and the same load (the same
prompts) round robin over 8 of them. The two alternate in one server, the order swapped
each round; the round of median throughput ratio (N / 8) is shown. After each load the
slab's figures are read from /v1/stats (its resident adapters; pages where it reports them)
and its loads and evictions from /metrics.

capacity: for rank 8 and rank 64 (each on a fresh server), distinct q/v adapters are
uploaded and served one request each, one after the other, until the slab's resident count
in /v1/stats stops growing, that is, until a load evicts: the most it held is its capacity
for that rank.

The client shares the host's cores with the server; the load average (1, 5, 15 min) at the
end of each measurement stands beside its table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.fleet_server import (
    AdapterMaker,
    complete,
    counters,
    describe,
    slab_figures,
    start_server,
    upload,
)
from bench.load import run_load, summarize, workload
from bench.servers import ROOT, Server, say

FEW = 8  # the popular set the fleet is compared with
UPLOADERS = 4  # uploads in flight: the server validates and hashes each in a worker thread


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def upload_fleet(client: httpx.Client, prefix: str, num: int, rank: int) -> list[str]:
    """Make and upload `num` distinct rank-`rank` adapters named prefix-0000...; their names."""
    maker, names = AdapterMaker(rank), [f"{prefix}-{i:04d}" for i in range(num)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(UPLOADERS) as pool:
        # made here, one at a time (one PEFT model), and uploaded UPLOADERS at once
        done = [pool.submit(upload, client, name, maker.files(i)) for i, name in enumerate(names)]
        for future in done:
            future.result()
    say(f"{num} rank-{rank} adapters made and uploaded in {time.perf_counter() - t0:.0f} s")
    return names


def measured_load(client, server: Server, models: list[str], seed: int, args) -> dict:
    """One closed-loop load over `models`; its summary, slab figures, counters and load avg."""
    before = counters(client)
    records, wall = run_load(server.url, workload(args.requests, models, seed=seed),
                             args.concurrency, max_tokens=args.max_tokens)  # fmt: skip
    after = counters(client)
    return {
        "summary": summarize(records, wall),
        "slab": slab_figures(client, set(models)),
        "loads": after["loads"] - before["loads"],
        "evictions": after["evictions"] - before["evictions"],
        "loadavg": loadavg(),
    }


def fleet(args, tmp: Path) -> list[dict]:
    """Every round's {"all": run, "few": run}, both loads on one server."""
    server = start_server(tmp, args.concurrency)
    rounds = []
    try:
        say(f"server ready in {server.wait_ready(args.ready_timeout):.0f} s")
        with httpx.Client(base_url=server.url, timeout=300) as client:
            names = upload_fleet(client, "fleet", args.adapters, rank=8)
            # Warm-up on the few: first-call costs stay out of the timed loads.
            warm, _ = run_load(server.url, workload(2 * FEW, names[:FEW], seed=99), FEW,
                               max_tokens=8)  # fmt: skip
            if any(r.error for r in warm):
                raise RuntimeError(f"warm-up failed: {next(r.error for r in warm if r.error)}")
            for r in range(args.rounds):
                start = (r * args.requests) % len(names)
                loads = {"all": names[start:] + names[:start], "few": names[:FEW]}
                run = {}
                for which in ("all", "few") if r % 2 == 0 else ("few", "all"):
                    if which == "few":  # untimed: the few are resident, as on a server of 8
                        run_load(server.url, workload(FEW, names[:FEW]), FEW, max_tokens=1)
                    run[which] = measured_load(client, server, loads[which], r, args)
                    s = run[which]["summary"]
                    say(f"round {r + 1} {which}: {s['tok_s']:.0f} tok/s, {s['errors']} errors, "
                        f"{run[which]['loads']:.0f} loads")  # fmt: skip
                rounds.append(run)
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        raise RuntimeError(f"{exc}\n  the server's log ends:\n{server.tail()}") from exc
    finally:
        server.stop()
    return rounds


def ratio(run: dict) -> float:
    return run["all"]["summary"]["tok_s"] / max(run["few"]["summary"]["tok_s"], 1e-9)


def fleet_table(rounds: list[dict], args) -> list[str]:
    ordered = sorted(rounds, key=ratio)
    mid = ordered[(len(ordered) - 1) // 2]
    lines = [
        f"fleet: middle of {len(rounds)} round(s) by the ratio "
        f"(all: {', '.join(f'{ratio(r):.2f}x' for r in rounds)})",
        f"load average (1 / 5 / 15 min) at the end of each load: {args.adapters} adapters "
        f"{mid['all']['loadavg']}; {FEW} adapters {mid['few']['loadavg']}\n",
        "| adapters | requests | errors | output tokens | seconds | tok/s | vs 8 adapters "
        "| TTFT p50 ms | TTFT p99 ms | slab loads | evictions | in a slab after / on host only "
        "| /v1/stats slab figures after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for which, count in (("all", args.adapters), ("few", FEW)):
        run, s = mid[which], mid[which]["summary"]
        versus = f"{ratio(mid):.2f}x" if which == "all" else "1.00x"
        lines.append(
            f"| {count} | {s['requests']} | {s['errors']} | {s['output_tokens']} "
            f"| {s['seconds']:.2f} | {s['tok_s']:.0f} | {versus} | {_ms(s['ttft_p50_ms'])} "
            f"| {_ms(s['ttft_p99_ms'])} | {run['loads']:.0f} | {run['evictions']:.0f} "
            f"| {run['slab']['in_slab']} / {run['slab']['on_host']} "
            f"| {describe(slab_only(run['slab']))} |"
        )
    firsts = [e for r in rounds for run in r.values() if (e := run["summary"]["first_error"])]
    return lines + ([f"\nfirst error: {firsts[0]}"] if firsts else [])


def capacity(rank: int, args, tmp: Path) -> dict:
    """Upload and serve distinct rank-`rank` adapters one by one until the slab evicts."""
    server = start_server(tmp, args.concurrency)
    held, served, figures, evicted = 0, 0, {}, False
    try:
        say(f"server ready in {server.wait_ready(args.ready_timeout):.0f} s")
        with httpx.Client(base_url=server.url, timeout=300) as client:
            maker, names = AdapterMaker(rank), set()
            for i in range(args.capacity_limit):
                name = f"r{rank}-{i:04d}"
                upload(client, name, maker.files(10_000 * rank + i))
                names.add(name)
                complete(client, name)
                served += 1
                now = slab_figures(client, names)
                if now["resident"] <= held:  # a load that did not add a resident evicted one
                    evicted = True
                    break
                held, figures = now["resident"], now
            figures["evictions"] = counters(client)["evictions"]
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        raise RuntimeError(f"{exc}\n  the server's log ends:\n{server.tail()}") from exc
    finally:
        server.stop()
    say(f"rank {rank}: {held} resident, {served} served, evicted: {evicted}")
    return {"rank": rank, "held": held, "served": served, "evicted": evicted,
            "figures": figures, "loadavg": loadavg()}  # fmt: skip


def capacity_table(results: list[dict], args) -> list[str]:
    lines = [
        f"capacity: load average (1 / 5 / 15 min) at its end: {results[-1]['loadavg']}\n",
        "| rank | adapters held at once | served until the first eviction "
        "| /v1/stats slab figures at the most held | evictions (/metrics) |",
        "|---:|---:|---:|---|---:|",
    ]
    for c in results:
        held = f"{c['held']}" if c["evicted"] else f">= {c['held']} (no eviction by then)"
        slab = slab_only(c["figures"])
        lines.append(
            f"| {c['rank']} | {held} | {c['served']} | {describe(slab)} "
            f"| {c['figures'].get('evictions', 0):.0f} |"
        )
    return lines


def slab_only(figures: dict) -> dict:
    """slab_figures' own figures, without the counts of our adapters by tier."""
    return {k: v for k, v in figures.items() if k not in ("in_slab", "on_host", "evictions")}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="64 adapters, 32 requests 16 in flight, 16 tokens, 1 round")  # fmt: skip
    ap.add_argument("--adapters", type=int, default=None, help="default 1000 (64 with --quick)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--requests", type=int, default=None, help="per load; default 256")
    ap.add_argument("--concurrency", type=int, default=None, help="in flight; default 32")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 64")
    ap.add_argument("--modes", nargs="+", choices=("fleet", "capacity"),
                    default=["fleet", "capacity"])  # fmt: skip
    ap.add_argument("--capacity-limit", type=int, default=None,
                    help="most adapters the capacity mode loads; default 2048 (40 with --quick)")  # fmt: skip
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds per server start")
    args = ap.parse_args(argv)
    quick = {"adapters": 64, "rounds": 1, "requests": 32, "concurrency": 16, "max_tokens": 16,
             "capacity_limit": 40}  # fmt: skip
    full = {"adapters": 1000, "rounds": 3, "requests": 256, "concurrency": 32, "max_tokens": 64,
            "capacity_limit": 2048}  # fmt: skip
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.adapters < FEW:
        ap.error(f"--adapters must be at least {FEW}, the set it is compared with")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    from bench.timing import machine

    t0, lines, failures = time.perf_counter(), [], []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for mode in args.modes:
            try:
                if mode == "fleet":
                    rounds = fleet(args, Path(tempfile.mkdtemp(dir=tmp)))
                    lines += [*fleet_table(rounds, args), ""]
                    errors = sum(run["summary"]["errors"] for r in rounds for run in r.values())
                    if errors:
                        failures.append(f"fleet: {errors} requests failed (first error above)")
                else:
                    ranks = (8, 64)
                    found = [capacity(r, args, Path(tempfile.mkdtemp(dir=tmp))) for r in ranks]
                    lines += capacity_table(found, args)
            except RuntimeError as exc:
                failures.append(f"{mode}: {exc}")
                say(f"{mode} failed: {str(exc).splitlines()[0]}")
    print(f"Machine: {machine()}, {os.cpu_count()} cores")
    print(f"Command: python -m bench.fleet {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"loraserve {head or '?'}, one process, demo kit (fp32), default lora section; "
        f"{args.requests} streamed completions a load, {args.concurrency} in flight, "
        f"{args.max_tokens} tokens each, greedy; {time.perf_counter() - t0:.0f} s in all\n"
    )
    for line in lines:
        print(line)
    for failure in failures:
        print(f"\nfailed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
