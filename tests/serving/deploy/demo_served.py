"""The demo kit (models/demo) served for the fault and stop tests: its config, streaming
clients (httpx, and the `openai` client), `loraserve serve` as a user runs it."""

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
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml
from openai import OpenAI

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"
ADAPTERS = ("upper", "rot13")
PROMPT = "def read_lines(path):\n"
STREAM_TIMEOUT_S = 60  # a stream must end well within this, whatever happens to its server


def write_demo_config(root: Path, port: int, num_replicas: int = 1, num_cpus: float = 1) -> Path:
    """num_replicas replicas of num_cpus each (one of one CPU by default), no draft model,
    state under root; the config's path."""
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
        "deploy": {"num_replicas": num_replicas, "resources": {"num_cpus": num_cpus}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Stream(threading.Thread):
    """One streamed completion read to its end with httpx; `events` holds the data of every
    event, `failure` what the read raised, `ended` when it ended (time.monotonic()).

    Once its first event is in, it waits at `started` (shared by the streams and the test),
    so the test acts while every stream is mid-way.
    """

    def __init__(self, url: str, model: str, max_tokens: int, started: threading.Barrier):
        super().__init__(daemon=True)
        self.url, self.model, self.started = url, model, started
        self.max_tokens = max_tokens
        self.events: list[str] = []
        self.failure: BaseException | None = None
        self.ended: float | None = None

    def text(self) -> str:
        """The completion's text, from its chunks."""
        chunks = [json.loads(e) for e in self.events if e != "[DONE]"]
        return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))

    def run(self) -> None:
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        try:
            self.read(body)
        except BaseException as exc:  # the test reports it
            self.failure = exc
            if not self.started.broken:
                self.started.abort()
        finally:
            self.ended = time.monotonic()

    def read(self, body: dict) -> None:
        with httpx.stream(
            "POST", f"{self.url}/v1/completions", json=body, timeout=STREAM_TIMEOUT_S
        ) as answer:
            assert answer.status_code == 200, answer.read()
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    self.event(line[6:])

    def event(self, data: str) -> None:
        self.events.append(data)
        if len(self.events) == 1:
            self.started.wait()


class ClientStream(Stream):
    """A Stream read by the `openai` client with no retries: `events` holds each chunk's
    JSON, and `failure` is the client's own exception."""

    def read(self, body: dict) -> None:
        client = OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                        timeout=STREAM_TIMEOUT_S)  # fmt: skip
        for chunk in client.completions.create(**body):
            self.event(chunk.model_dump_json())


@contextlib.contextmanager
def launched(root: Path, config: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`loraserve serve --config config` as a user runs it, in a session of its own with HOME
    and Ray's temp dir under root and a short temp folder: (the process, its log). If it is
    still running at the end, its own process group is killed, never `ray stop`."""
    # Short: launch.ray_temp_dir() puts Ray's sockets under $XDG_CACHE_HOME when it is short.
    cache = tempfile.mkdtemp(prefix="lsserve-")
    (root / "home").mkdir(exist_ok=True)  # a home that exists, as a user's does
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
