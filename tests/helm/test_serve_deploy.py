"""The chart's Serve config on a real Ray cluster, in miniature: the cpu-dev value set rendered,
its in-cluster paths pointed at this checkout's demo kit and a temp dir, deployed as rendered
(no HTTP proxy) with `serve deploy` to a `ray start --head` of the test's own: the replica
answers /readyz and a completion on the config's server.port itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helm.render import render, serve_config, server_config, value_set
from tests.serving.deploy.ray_head import BIN, env_for, ray_head
from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def local(config: dict, tmp: Path, port: int) -> dict:
    """The chart's server config with its mounts replaced by this host's folders."""
    text = yaml.safe_dump(config)
    for mount, here in (("/models/", f"{REPO}/models/"), ("/registry", f"{tmp}/registry"),
                        ("/data/", f"{tmp}/")):  # fmt: skip
        text = text.replace(mount, here)
    out = yaml.safe_load(text)
    out["server"] |= {"host": "127.0.0.1", "port": port}
    out["cache"]["num_blocks"] = 128  # a small host
    return out


def test_the_rendered_serve_config_deploys_and_answers(tmp_path):
    objects = render(value_set("cpu-dev"))
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(local(server_config(objects), tmp_path, port)))
    app = serve_config(objects)
    (only,) = app["applications"]
    only["args"]["config"] = str(config)
    serve_yaml = tmp_path / "serve.yaml"
    serve_yaml.write_text(yaml.safe_dump(app))

    with ray_head(tmp_path, dashboard=True) as head:
        env = env_for(tmp_path / "home")
        deploy = subprocess.run(
            [str(BIN / "serve"), "deploy", str(serve_yaml), "--address", head.dashboard],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        url = f"http://127.0.0.1:{port}"  # the replica's own listener: no proxy runs
        wait_ready(url, timeout=300)
        body = {"model": "demo:upper", "prompt": "def read_lines(path):\n", "max_tokens": 12,
                "temperature": 0}  # fmt: skip
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["usage"]["completion_tokens"] > 0 and answer["choices"][0]["text"]
        subprocess.run(
            [str(BIN / "serve"), "shutdown", "-y", "--address", head.dashboard],
            env=env, capture_output=True, timeout=120,
        )  # fmt: skip
