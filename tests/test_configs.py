"""configs/: the demo's configuration and the examples for real models on GPUs all load."""

from pathlib import Path

import pytest

from serving.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_gpu_examples_beside_the_demo():
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "llama-3.1-8b-fp8.yaml"}
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path):
    cfg = load_config(path)
    if path.name == "demo.yaml":
        assert cfg.deploy.resources.num_gpus == 0
        return
    # A GPU example: one GPU per replica, and keys wherever it listens beyond loopback.
    assert cfg.deploy.resources.num_gpus == 1 and cfg.model.quantization == "auto"
    if cfg.server.host not in ("127.0.0.1", "localhost", "::1"):
        assert cfg.server.api_keys_file is not None
