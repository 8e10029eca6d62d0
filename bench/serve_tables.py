"""bench/serve.py's tables: each server's throughput and TTFT beside vLLM's, and its process
tree's CPU per 1,000 output tokens by role, from the middle round of each."""

from __future__ import annotations

from typing import NamedTuple

from bench.load import Record, same_text, summarize
from bench.process_cpu import ROLE_ORDER, TreeCpu

# loraserve-local: the same app and engine in one process, no Ray (bench/peers/local_server.py);
# loraserve-checkout: `loraserve serve` from --checkout's tree
SERVERS = ("loraserve", "loraserve-local", "vllm", "loraserve-checkout")


class Level(NamedTuple):
    """One timed load run: its records and wall seconds, the server tree's CPU and the client's."""

    records: list[Record]
    wall: float
    cpu: TreeCpu
    client_s: float


def median_round(results: list[Level]) -> Level:
    """Of one server's rounds at one concurrency, the middle one by tok/s."""
    ordered = sorted(results, key=lambda r: summarize(r.records, r.wall)["tok_s"])
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
            s, ratio, same = summarize(result.records, result.wall), "", ""
            if peer and name != "vllm":
                ratio = fmt(s["tok_s"] / summarize(peer.records, peer.wall)["tok_s"], ".2f", "x")
                same = f"{same_text(result.records, peer.records)}/{s['requests']}"
            lines.append(
                f"| {name} | {c} | {s['requests']} | {s['errors']} | {s['output_tokens']} "
                f"| {s['seconds']:.2f} | {s['tok_s']:.0f} | {fmt(s['ttft_p50_ms'])} "
                f"| {fmt(s['ttft_p99_ms'])} | {ratio} | {same} |"
            )
    return lines


def cpu_table(runs: dict[str, dict], concurrency: list[int]) -> list[str]:
    """CPU seconds per 1,000 output tokens: the server's process tree, by role, the client."""
    levels = [(name, c, runs[name][c]) for c in concurrency for name in SERVERS
              if c in runs.get(name, {})]  # fmt: skip
    roles = [r for r in ROLE_ORDER if any(lv.cpu.seconds.get(r) for _, _, lv in levels)]
    lines = [
        "| server | concurrency | output tokens | server, all | " + " | ".join(roles)
        + " | client | processes (started, ended) |",
        "|---|---:|---:|---:|" + "---:|" * len(roles) + "---:|---:|",
    ]  # fmt: skip
    for name, c, lv in levels:
        tokens = summarize(lv.records, lv.wall)["output_tokens"]
        per_1k = 1000 / tokens if tokens else 0.0
        cells = [fmt(lv.cpu.seconds[r] * per_1k, ".2f") if r in lv.cpu.seconds else "-"
                 for r in roles]  # fmt: skip
        lines.append(
            f"| {name} | {c} | {tokens} | {lv.cpu.total * per_1k:.2f} | " + " | ".join(cells)
            + f" | {lv.client_s * per_1k:.2f} | {lv.cpu.processes} "
            f"({lv.cpu.started}, {lv.cpu.ended}) |"
        )  # fmt: skip
    return lines


def busiest_processes(name: str, c: int, level: Level, top: int = 12) -> list[str]:
    """The processes of a server's tree that spent most CPU in a timed run, with their roles."""
    tokens = summarize(level.records, level.wall)["output_tokens"] or 1
    lines = [f"{name} C={c}: CPU s per 1000 tokens, role, command line"]
    for spent, seen in level.cpu.each[:top]:
        lines.append(f"    {spent * 1000 / tokens:6.2f}  {seen.role}: {seen.cmdline[:100]}")
    return lines
