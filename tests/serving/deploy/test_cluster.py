"""The app on a Ray cluster it joins by deploy.ray_address: keys reach the replicas, and a
replica refuses to serve beside Serve's HTTP proxies, or keyless on a public server.host.

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

from serving.config import load_config
from serving.deploy.app import APP_NAME, bind, build
from serving.deploy.exposure import OpenServerError
from serving.deploy.replica import SERVER_NAME
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


def _refused(app, why: str) -> str:
    """Deploy app on the joined cluster's Serve, which must fail; each replica's message."""
    with pytest.raises(RuntimeError, match="Deploying application"):
        serve.run(app, name=APP_NAME, route_prefix="/")
    message = serve.status().applications[APP_NAME].deployments[SERVER_NAME].message
    assert why in message, message
    return message


@pytest.fixture
def joined(cluster, monkeypatch):
    """The cluster's address, this process joined to it with no API keys in its env; Serve is
    the test's to start (one left by another test keeps its own options: it is shut down)."""
    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    ray.init(address=cluster, logging_level=logging.WARNING)
    try:
        serve.shutdown()
        yield cluster
    finally:
        serve.shutdown()
        ray.shutdown()


def test_a_replica_refuses_to_start_beside_serve_proxies(joined, tmp_path):
    """Serve started with its HTTP proxies (as `serve run` or KubeRay would by default): each
    ModelServer replica refuses, naming proxy_location: Disabled, and nothing serves the app."""
    port, proxy_port = free_port(), free_port()
    config = _config(tmp_path, joined, port)
    serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
    why = _refused(build({"config": str(config)}), "proxy_location: Disabled")
    assert "ProxyEnabledError" in why, why
    for answering in (port, proxy_port):  # nothing answers, or not with a model list
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{answering}/v1/models", timeout=5).raise_for_status()


def test_a_keyless_app_refuses_a_public_server_host(joined, tmp_path):
    """server.host 0.0.0.0 with no keys: the builder refuses, and each replica, handed the
    config past the builder, refuses to listen there."""
    port = free_port()
    config = _config(tmp_path, joined, port, host="0.0.0.0")
    with pytest.raises(OpenServerError, match=r"refusing to serve on 0\.0\.0\.0"):
        build({"config": str(config)})
    serve.start(proxy_location="Disabled")
    why = _refused(bind(load_config(config), {}), "refusing to serve on 0.0.0.0")
    assert "--insecure" in why, why
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).raise_for_status()
