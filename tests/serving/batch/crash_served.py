"""The one-process HTTP server (bench.peers.local_server) over the demo kit, as a subprocess
that a test SIGKILLs and starts again over the same batch store, for test_crash.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "models" / "demo"
ADAPTERS = ("upper", "rot13", "comment")
READY_TIMEOUT_S = 180


def write_config(root: Path) -> Path:
    """The demo model and its adapters without a draft model; all state under root."""
    config = {
        "model": {"id": "demo", "path": str(DEMO / "base"), "max_model_len": 512},
        "draft": {"method": "none"},
        "lora": {
            "registry": str(root / "registry"),
            "preload": {name: str(DEMO / "adapters" / name) for name in ADAPTERS},
        },
        "cache": {"num_blocks": 256},
        "scheduler": {"max_num_seqs": 4},
        "batch": {"store": f"sqlite:///{root / 'batch.db'}", "max_in_flight": 4},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KillableServer:
    """local_server on root's config, in a session of its own (so SIGKILL reaches all of it),
    keyless (LORASERVE_API_KEYS dropped), HOME under root, its output in root/server.log."""

    def __init__(self, root: Path) -> None:
        self.root, self.config = root, write_config(root)
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""
        env = {k: v for k, v in os.environ.items() if k != "LORASERVE_API_KEYS"}
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.env = {**env, "HOME": str(root / "home"), "PYTHONPATH": path}

    def start(self) -> None:
        """Start it on a free port and wait until /readyz answers 200; a second port if the
        first was taken between choosing it and the server binding it."""
        for _ in range(2):
            port = free_port()
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "bench.peers.local_server",
                     "--config", str(self.config), "--port", str(port)],
                    cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            self.url = f"http://127.0.0.1:{port}"
            if self._ready():
                return
        raise RuntimeError(f"the server did not start:\n{self.tail()}")

    def _ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return True
            time.sleep(0.2)
        self.kill()
        return False

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would: nothing of it runs afterwards."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def post(self, body: dict, *, queue: bool = False) -> dict:
        """POST /ai/run/demo; the answer's result, after checking it succeeded."""
        query = "?queueRequest=true" if queue else ""
        r = httpx.post(f"{self.url}/ai/run/demo{query}", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["result"]

    def wait_for(self, request_id: str, done, timeout: float = 240) -> dict:
        """Poll the batch until done(result) holds; that result."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.post({"request_id": request_id})
            if done(result):
                return result
            assert result["status"] in ("queued", "running"), result
            time.sleep(0.05)
        raise AssertionError(f"batch {request_id} never got there:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""
