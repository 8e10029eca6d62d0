"""A lone replica killed: how soon its port listens again and every model answers (CPU).

    python -m bench.faults [--kills 3]

`loraserve serve` over the demo kit (bench/servers.py), one ModelServer replica. Each round
kills the replica's process (SIGKILL, as the kernel's OOM killer would) while a stream runs,
then asks each model (the demo's two adapters and the base) until it answers 200: seconds
from the kill until the port listens again, and until each model answered. The rounds'
middle is reported. Target: every model answers within 10 s of the kill. That the killed
replica's streams are cut (never hung), and that the new replica loads its adapters again,
is tests/serving/deploy/test_faults.py's to check.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.process_cpu import REPLICA, snapshot
from bench.servers import start_loraserve
from bench.timing import machine

MODELS = ("demo:upper", "demo:rot13", "demo")
GIVE_UP_S = 120.0


def replica_pids(server_pid: int) -> list[int]:
    """The ModelServer replica processes among the server's descendants."""
    return [pid for (pid, _), seen in snapshot(server_pid, "loraserve").items() if seen.role == REPLICA]  # fmt: skip


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def stream(url: str) -> None:
    """A long stream, cut by the kill (its error is the point, not raised)."""
    body = {"model": "demo:upper", "prompt": "hello", "max_tokens": 400, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                pass
    except httpx.HTTPError:
        pass


def answered(url: str, model: str, since: float) -> float:
    """Seconds from since until model answers a completion with 200."""
    body = {"model": model, "prompt": "hello", "max_tokens": 8, "temperature": 0}
    while time.monotonic() - since < GIVE_UP_S:
        try:
            if httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200:
                return time.monotonic() - since
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{model} did not answer within {GIVE_UP_S:.0f} s of the kill")


def one_kill(server) -> dict[str, float]:
    """Kill the replica mid-stream; seconds until it listens and until each model answers."""
    (pid,) = replica_pids(server.proc.pid)
    streaming = threading.Thread(target=stream, args=(server.url,), daemon=True)
    streaming.start()
    time.sleep(0.5)  # the stream is running
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while listens(server.port):  # the dying process's socket closes
        time.sleep(0.01)
    while not listens(server.port):
        if time.monotonic() - killed > GIVE_UP_S:
            raise RuntimeError("the port was not listened on again")
        time.sleep(0.01)
    row = {"listens": time.monotonic() - killed}
    for model in MODELS:
        row[model] = answered(server.url, model, killed)
    streaming.join(60)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--kills", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}\n")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HOME"] = tmp  # Ray's session files and the CLI's state stay in tmp
        server = start_loraserve(Path(tmp), max_num_seqs=8)
        try:
            server.wait_ready(300)
            rows = []
            for _ in range(args.kills):
                for model in MODELS:  # every adapter loaded before the kill
                    answered(server.url, model, time.monotonic())
                rows.append(one_kill(server))
                print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in rows[-1].items()), flush=True)
        finally:
            server.stop()
    keys = list(rows[0])
    print(f"\n| seconds after the kill (middle of {len(rows)}) | {' | '.join(keys)} |")
    print("|---|" + "---:|" * len(keys))
    print("| lone replica, SIGKILL mid-stream | "
          + " | ".join(f"{statistics.median(r[k] for r in rows):.1f}" for k in keys) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
