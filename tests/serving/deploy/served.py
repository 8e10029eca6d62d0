"""The served world of the deploy tests: its config, the client side, the reference engine."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.world import World

MODEL_ID = "tiny"
REPLICAS = 2  # one CPU each: ray.init(num_cpus=2); the ingress takes none
SPEC = {"method": "ngram", "num_speculative_tokens": 3}
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass
class Served:
    url: str
    world: World
    registry: str  # the app's adapter registry, a folder
    reference: object  # an in-process Engine over the same model folder, never started

    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def expected(self, prompt_ids: list[int], adapter: str | None, max_tokens: int) -> str:
        """The text the engine generates for this request alone (greedy)."""
        return "".join(o.new_text for o in self.alone(prompt_ids, adapter, max_tokens))

    def alone(self, prompt_ids, adapter: str | None, max_tokens: int):
        """The engine's outputs for this request alone (greedy), by the world's adapter name."""
        version = self.world.versions[adapter] if adapter else None
        return self.run_alone(prompt_ids, version, max_tokens)

    def run_alone(self, prompt_ids, version, max_tokens):
        outs = []
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        request = GenerateRequest(f"ref{time.monotonic_ns()}", tuple(prompt_ids), sampling, version)
        self.reference.submit(request, outs.append)
        self.reference.run_until_idle()
        return outs

    def metrics(self) -> dict[str, list]:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(root: Path, world: World, port: int) -> Path:
    config = {
        "model": {"id": MODEL_ID, "path": str(world.base_dir), "max_model_len": 512},
        "draft": SPEC,
        "lora": {
            "max_loras": 4,
            "max_lora_rank": 16,
            "max_cpu_loras": 8,
            "registry": str(root / "registry"),
            "preload": {"upper": str(world.root / "upper")},
        },
        "cache": {"block_size": 4, "num_blocks": 1024},
        "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
        "server": {"host": "127.0.0.1", "port": port},
        "deploy": {"num_replicas": REPLICAS, "resources": {"num_cpus": 1, "num_gpus": 0}},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
        "batch": {"store": f"sqlite:///{root / 'batch.db'}"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_ready(url: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/readyz", timeout=5)
            if answer.status_code == 200:
                return
            assert answer.status_code == 503 and answer.json(), answer.text
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url}/readyz did not answer 200 within {timeout} s")


@contextlib.contextmanager
def serving(config: Path, port: int, home: Path) -> Iterator[str]:
    """The app of config served on loopback port by a Ray of its own; yields its URL once ready.

    Serve starts as `loraserve serve` starts it, with no HTTP proxy: port is the config's
    server.port, on which each replica listens itself.

    Ray gets a short temp dir of its own (its socket paths must fit 107 bytes) and HOME is
    home meanwhile (whatever Ray or a worker writes under ~); it stops with serve.shutdown()
    and ray.shutdown(), never `ray stop`, which would stop every Ray on the machine.
    """
    import ray
    from ray import serve

    from serving.deploy.app import APP_NAME, build

    ray_dir = tempfile.mkdtemp(prefix="lsray-")
    # Ray's processes inherit these. A process keeps the auth token of the first Ray it
    # joined, so a second loopback test cluster (another module, another HOME) would never
    # start for it: these clusters run without token auth.
    env = {"HOME": str(home), "RAY_AUTH_MODE": "disabled"}
    # A home that exists, as a user's does: the replicas cache the compiled CPU kernel there,
    # so a replica that Serve restarts does not build it again.
    home.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=ray_dir)
    try:
        serve.start(proxy_location="Disabled")
        serve.run(build({"config": str(config)}), name=APP_NAME, route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(ray_dir, ignore_errors=True)
