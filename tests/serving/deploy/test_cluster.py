"""The app on a Ray cluster it joins by deploy.ray_address: keys reach the replicas, and a
keyless app behind a public Serve proxy refuses to serve.

The cluster is this module's own `ray start --head`, in a temp dir of its own, on ports of
its own, without LORASERVE_API_KEYS in its environment (as on a remote node); it is stopped
by its process group, never by `ray stop`, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve

from serving.deploy.app import APP_NAME, build
from serving.deploy.stream_end import PROXY_ENV
from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo" / "base"
BIN = Path(sys.executable).parent
PORT_FLAGS = ("--port", "--node-manager-port", "--object-manager-port", "--ray-client-server-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--metrics-export-port", "--runtime-env-agent-port")  # fmt: skip
START_TIMEOUT_S = 120


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LORASERVE_API_KEYS"}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), **extra}


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """sig to proc, then SIGKILL to its process group (its own session) after timeout."""
    if proc.poll() is None:
        proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):  # whatever it started and left behind
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The GCS address of a fresh 2-CPU head node."""
    root = tmp_path_factory.mktemp("cluster")
    ray_dir = tempfile.mkdtemp(prefix="lsrc-")  # short: Ray's socket paths must fit 107 bytes
    ports = {flag: free_port() for flag in PORT_FLAGS}
    command = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2",
               "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={ray_dir}",
               *(f"{flag}={port}" for flag, port in ports.items())]  # fmt: skip
    log = root / "ray.log"
    # No drain on SIGTERM: the node has nothing to hand over.
    # The proxy's middleware, as README.md's multi-node section sets it on every node: a
    # proxy without a route yet answers /readyz 503, not 404.
    env = _env(root / "home", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", **PROXY_ENV)
    with open(log, "w") as out:
        head = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{ports['--port']}"
    finally:
        _stop(head, signal.SIGTERM, timeout=30)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _config(root: Path, address: str, port: int, host: str = "127.0.0.1") -> Path:
    config = {
        "model": {"id": "demo", "path": str(DEMO), "max_model_len": 128},
        "lora": {"registry": str(root / "registry")},
        "cache": {"num_blocks": 32},
        "scheduler": {"max_num_seqs": 4},
        "server": {"host": host, "port": port},
        "deploy": {"ray_address": address, "resources": {"num_cpus": 1}},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_keys_from_the_driver_reach_the_replicas(cluster, tmp_path):
    """`loraserve serve` joins the cluster with LORASERVE_API_KEYS in its own env only."""
    port = free_port()
    config = _config(tmp_path, cluster, port)
    env = _env(tmp_path / "home", LORASERVE_API_KEYS="k1:acme:user")
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(BIN / "loraserve"), "serve", "--config", str(config)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
        wrong = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k1"})
        assert right.status_code == 200, right.text
    finally:
        _stop(proc, signal.SIGINT, timeout=60)  # drains and removes only its app
    assert proc.returncode == 0, log.read_text()


def test_a_keyless_app_refuses_a_public_serve_proxy(cluster, tmp_path, monkeypatch):
    """The builder sees server.host 127.0.0.1, but Serve's proxy listens on 0.0.0.0 (as under
    `serve run` or KubeRay): each ModelServer replica reads that host and refuses to start."""
    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    port = free_port()
    config = _config(tmp_path, cluster, port)
    ray.init(address=cluster, logging_level=logging.WARNING)
    try:
        serve.shutdown()  # a Serve left by another test keeps its own proxy options
        serve.start(http_options={"host": "0.0.0.0", "port": port})
        with pytest.raises(RuntimeError, match="Deploying application"):
            serve.run(build({"config": str(config)}), name=APP_NAME, route_prefix="/")
        why = serve.status().applications[APP_NAME].deployments["ModelServer"].message
        assert "refusing to serve on 0.0.0.0" in why and "--insecure" in why, why
        with pytest.raises(httpx.HTTPError):  # nothing answers, or not with a model list
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).raise_for_status()
    finally:
        serve.shutdown()
        ray.shutdown()
