"""The app on a Ray cluster it joins by deploy.ray_address: keys reach the replicas, and a
keyless app behind a public Serve proxy refuses to serve.

The cluster is this module's own `ray start --head`, in a temp dir of its own, on ports of
its own, without LORASERVE_API_KEYS in its environment (as on a remote node); it is stopped
by its process group, never by `ray stop`, which would stop every Ray on the machine.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve

from serving.deploy.app import APP_NAME, build
from tests.serving.deploy.ray_head import BIN, env_for, ray_head, stop
from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo" / "base"
KEY = "k1-0123456789abcdef"  # an API key long enough to be accepted


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The GCS address of a fresh 2-CPU head node."""
    with ray_head(tmp_path_factory.mktemp("cluster")) as head:
        yield head.address


def _config(root: Path, address: str, port: int, host: str = "127.0.0.1") -> Path:
    config = {
        "model": {"id": "demo", "path": str(DEMO), "max_model_len": 128},
        "lora": {"registry": str(root / "registry")},
        "cache": {"num_blocks": 32},
        "scheduler": {"max_num_seqs": 4},
        "server": {"host": host, "port": port},
        "deploy": {"ray_address": address, "resources": {"num_cpus": 1}},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
        "batch": {"store": f"sqlite:///{root / 'batch.db'}"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_keys_from_the_driver_reach_the_replicas(cluster, tmp_path):
    """`loraserve serve` joins the cluster with LORASERVE_API_KEYS in its own env only."""
    port = free_port()
    config = _config(tmp_path, cluster, port)
    env = env_for(tmp_path / "home", LORASERVE_API_KEYS=f"{KEY}:acme:user")
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
        right = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 200, right.text
    finally:
        stop(proc, signal.SIGINT, timeout=60)  # drains and removes only its app
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
