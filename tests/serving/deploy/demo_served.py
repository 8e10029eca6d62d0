"""The demo kit (models/demo) served for the fault tests: its config, a streaming client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"
ADAPTERS = ("upper", "rot13")
PROMPT = "def read_lines(path):\n"
STREAM_TIMEOUT_S = 60  # a stream must end well within this, whatever happens to its server


def write_demo_config(root: Path, port: int) -> Path:
    """One CPU replica, no draft model, state under root; the config's path."""
    config = {
        "model": {"id": "demo", "path": str(DEMO / "base"), "max_model_len": 512},
        "draft": {"method": "none"},
        "lora": {
            "registry": str(root / "registry"),
            "preload": {name: str(DEMO / "adapters" / name) for name in ADAPTERS},
        },
        "cache": {"num_blocks": 512},
        "scheduler": {"max_num_seqs": 8},
        "server": {"host": "127.0.0.1", "port": port},
        "batch": {"store": f"sqlite:///{root / 'batch.db'}"},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
        "deploy": {"num_replicas": 1, "resources": {"num_cpus": 1}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Stream(threading.Thread):
    """One streamed completion read to its end; `events` holds the data of every event.

    Once its first event is in, it waits at `started` (shared by the streams and the test),
    so the test acts while every stream is mid-way.
    """

    def __init__(self, url: str, model: str, max_tokens: int, started: threading.Barrier):
        super().__init__(daemon=True)
        self.url, self.model, self.started = url, model, started
        self.max_tokens = max_tokens
        self.events: list[str] = []
        self.failure: BaseException | None = None

    def text(self) -> str:
        """The completion's text, from its chunks."""
        chunks = [json.loads(e) for e in self.events if e != "[DONE]"]
        return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))

    def run(self) -> None:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/completions", json=body, timeout=STREAM_TIMEOUT_S
            ) as answer:
                assert answer.status_code == 200, answer.read()
                first = True
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        if first:
                            first = False
                            self.started.wait()
        except BaseException as exc:  # the test reports it
            self.failure = exc
            if not self.started.broken:
                self.started.abort()


@contextlib.contextmanager
def launched(root: Path, config: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`loraserve serve --config config` as a user runs it, in a session of its own with HOME
    and Ray's temp dir under root and a short temp folder: (the process, its log). If it is
    still running at the end, its own process group is killed, never `ray stop`."""
    # Short: launch.ray_temp_dir() puts Ray's sockets under $XDG_CACHE_HOME when it is short.
    cache = tempfile.mkdtemp(prefix="lsserve-")
    env = {**os.environ, "HOME": str(root / "home"), "XDG_CACHE_HOME": cache}
    env.pop("LORASERVE_API_KEYS", None)
    log = root / "serve.log"
    exe = Path(sys.executable).parent / "loraserve"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(exe), "serve", "--config", str(config)], env=env, cwd=root,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(cache, ignore_errors=True)
