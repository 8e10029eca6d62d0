"""Batch fairness: interactive TTFT and batch throughput, each alone and both at once, in one run.

    python -m bench.batch_api [--quick] [--items 2000] [--max-in-flight 8] [--clients 3]
                          [--idle-s 60] [--max-tokens 32] [--batch-max-tokens 24]

One process serves the demo kit (bench/peers/local_server.py: the app, the engine and the
batch feeder over batch.store) with configs/demo.yaml's settings (draft model, 32 sequences)
and its state in a temporary folder; --max-in-flight writes batch.max_in_flight. Three
phases, one after the other against the same server:

  idle         C interactive clients alone for --idle-s seconds, half first and half last
               (so it spans the host's drift): each sends a streamed /v1/chat/completions
               request (a short chat, greedy, --max-tokens tokens, the base model or one of
               its three adapters at random), reads it to its end, waits about --think-s and
               sends the next; TTFT is the time to the first SSE event carrying content
  batch alone  an N-item Workers-AI batch (POST /ai/run/demo?queueRequest=true, adapters
               dealt round-robin over base, upper, comment, rot13, --batch-max-tokens each)
               polled until done; throughput is items/s and completion tokens/s
  both         the same batch submitted again while the same clients run for its whole time

Targets: the TTFT p50 of `both` at most 1.5x `idle`'s, and the batch's throughput in `both`
at least 0.70x `batch alone`'s. The client shares the cores (its traffic:
bench/batch_clients.py); `load avg` is the host's 1-minute load average as each phase ended
(other jobs' included).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.batch_clients import MODELS, Chat, batch_items, chat, clients, run_batch
from bench.load import PROMPTS, percentile
from bench.servers import DEMO, ROOT, Server, free_port, loraserve_config


def _log(msg: str) -> None:
    print(f"[batch] {msg}", file=sys.stderr, flush=True)


def config(tmp: Path, max_in_flight: int, draft: bool) -> Path:
    """bench/serve.py's config (demo.yaml, state in tmp), with the demo's draft model back."""
    path = loraserve_config(tmp, max_num_seqs=32)
    cfg = yaml.safe_load(path.read_text())
    if draft:
        demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
        cfg["draft"] = {**demo["draft"], "path": str(DEMO / "draft")}
    cfg["batch"]["max_in_flight"] = max_in_flight
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    from serving.config import load_config

    load_config(path)
    return path


async def phase(url: str, args, *, interactive: bool, items: list[dict] | None, seed: int):
    """(the chats sent while the phase ran or None, batch figures or None) for one phase."""
    stop = asyncio.Event()
    load = interactive and asyncio.create_task(clients(url, args.clients, stop, args, seed))
    t0 = time.perf_counter()
    try:
        if items is not None:
            batch = await run_batch(url, items)
        else:
            batch = None
            await asyncio.sleep(args.idle_s / 2)
    finally:
        stop.set()
    t1 = time.perf_counter()
    records = None if not load else [r for r in await load if t0 <= r.start < t1]
    failed = [r.error or "no content" for r in records or () if r.error or r.ttft is None]
    if failed:
        raise RuntimeError(f"{len(failed)} interactive requests failed: {failed[:3]}")
    return records, batch


def figures(records: list[Chat] | None) -> dict:
    if not records:
        return {}
    ttft, e2e = [r.ttft * 1000 for r in records], [r.seconds * 1000 for r in records]
    return {"requests": len(records), "p50": percentile(ttft, 50), "p90": percentile(ttft, 90),
            "e2e_p50": percentile(e2e, 50)}  # fmt: skip


def fmt(x, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: dict[str, tuple]) -> list[str]:
    idle, alone, both = rows["idle"][0], rows["batch alone"][1], rows["both"]
    lines = [
        "| phase | interactive requests | TTFT p50 ms | TTFT p90 ms | e2e p50 ms | batch items "
        "| batch s | items/s | tokens/s | load avg | TTFT p50 vs idle | batch vs alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (inter, batch, load) in rows.items():
        batch = batch or {}
        ttft_ratio = tput_ratio = ""
        if name == "both":
            ttft_ratio = f"{inter['p50'] / idle['p50']:.2f}x"
            tput_ratio = f"{batch['items_s'] / alone['items_s']:.2f}x"
        lines.append(
            f"| {name} | {fmt(inter.get('requests'))} | {fmt(inter.get('p50'))} "
            f"| {fmt(inter.get('p90'))} | {fmt(inter.get('e2e_p50'))} | {fmt(batch.get('items'))} "
            f"| {fmt(batch.get('seconds'), '.1f')} | {fmt(batch.get('items_s'), '.2f')} "
            f"| {fmt(batch.get('tokens_s'))} | {load} | {ttft_ratio} | {tput_ratio} |"
        )
    ttft_ok = both[0]["p50"] <= 1.5 * idle["p50"]
    tput_ok = both[1]["items_s"] >= 0.70 * alone["items_s"]
    lines.append("")
    lines.append(f"TTFT p50 both/idle <= 1.5x: {'met' if ttft_ok else 'missed'}; "
                 f"batch throughput both/alone >= 0.70x: {'met' if tput_ok else 'missed'}")  # fmt: skip
    return lines


async def bench(url: str, args) -> dict[str, tuple]:
    """{phase: (interactive figures, batch figures, load averages)}."""
    # Warm-up: every model once by chat, and a small batch, out of the timed phases.
    async with httpx.AsyncClient(timeout=300) as client:
        for i, model in enumerate(MODELS):
            body = {"model": model, "stream": True, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": PROMPTS[i]}]}  # fmt: skip
            if (rec := await chat(client, url, body)).error:
                raise RuntimeError(f"warm-up chat failed: {rec.error}")
    await run_batch(url, batch_items(2 * len(MODELS), args.batch_max_tokens))
    items = batch_items(args.items, args.batch_max_tokens)
    # Idle runs in two halves, first and last, so that its figure spans the host's drift.
    plan = [("idle", True, None), ("batch alone", False, items), ("both", True, items),
            ("idle", True, None)]  # fmt: skip
    runs: dict[str, list] = {}
    for seed, (name, interactive, its) in enumerate(plan):
        _log(f"phase {name}")
        records, batch = await phase(url, args, interactive=interactive, items=its, seed=seed)
        load = f"{os.getloadavg()[0]:.1f}"
        _log(f"phase {name}: {figures(records)} {batch} load {load}")
        runs.setdefault(name, []).append((records, batch, load))
    return {
        name: (figures([c for r, _, _ in parts for c in r or ()]), parts[0][1],
               "/".join(load for _, _, load in parts))
        for name, parts in runs.items()
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 items, 10 s idle: a smoke test")
    ap.add_argument("--items", type=int, default=None, help="batch items; default 2000")
    ap.add_argument("--max-in-flight", type=int, default=8, help="batch.max_in_flight")
    ap.add_argument("--clients", type=int, default=3, help="interactive clients")
    ap.add_argument("--idle-s", type=float, default=None, help="idle phase; default 60 s")
    ap.add_argument("--think-s", type=float, default=0.5, help="a client's mean pause")
    ap.add_argument("--max-tokens", type=int, default=32, help="per interactive request")
    ap.add_argument("--batch-max-tokens", type=int, default=24, help="per batch item")
    ap.add_argument("--no-draft", action="store_true", help="draft.method none")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    args.items = args.items or (40 if args.quick else 2000)
    args.idle_s = args.idle_s or (10.0 if args.quick else 60.0)
    from bench.timing import machine

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        cfg = config(Path(tmp), args.max_in_flight, draft=not args.no_draft)
        cmd = [sys.executable, "-m", "bench.peers.local_server", "--config", str(cfg),
               "--port", str(free_port())]  # fmt: skip
        server = Server("loraserve-local", cmd, "/readyz", Path(tmp) / "server.log")
        try:
            _log(f"ready in {server.wait_ready(args.ready_timeout):.0f} s")
            rows = asyncio.run(bench(server.url, args))
        except RuntimeError as exc:
            print(f"failed: {exc}\nserver log:\n{server.tail()}")
            return 1
        finally:
            server.stop()
    print(f"Machine: {machine()}, {os.cpu_count()} cores")
    print(f"Command: python -m bench.batch_api {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"loraserve {head or '?'}, one process; demo kit (fp32), "
        f"draft {'none' if args.no_draft else 'draft_model'}, batch.max_in_flight "
        f"{args.max_in_flight}; {args.clients} clients, think {args.think_s} s, "
        f"{args.max_tokens} tokens a chat; {args.items} batch items of {args.batch_max_tokens} "
        f"tokens at most; {time.perf_counter() - t0:.0f} s in all\n"
    )
    for line in table(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
