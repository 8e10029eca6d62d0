"""A keyless server serves loopback only, and the builder hands its keys to the replicas.

These run without Ray: build() refuses before it binds anything. The same rule inside a
replica, on server.host on a real cluster, is in test_cluster.py.
"""

from pathlib import Path

import pytest
import yaml

from serving.api.core.caller import Principal
from serving.config import ConfigError
from serving.deploy.app import build
from serving.deploy.exposure import OpenServerError, check_open_server, is_loopback

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo" / "base"
K1, K2 = "k1-0123456789abcdef", "k2-0123456789abcdef"
KEY = {K1: Principal("acme", "user")}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("example.com", False), ("", False), ("<unknown>", False)],
)  # fmt: skip
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_the_rule():
    check_open_server(["127.0.0.1", "::1"], {}, insecure=False)
    check_open_server(["127.0.0.1", None], {}, insecure=False)  # None: a listener switched off
    check_open_server(["0.0.0.0"], KEY, insecure=False)  # keys: any host
    check_open_server(["0.0.0.0"], {}, insecure=True)  # the operator's explicit choice
    for hosts in (["0.0.0.0"], ["127.0.0.1", "0.0.0.0"], ["127.0.0.1", "<unknown>"]):
        with pytest.raises(OpenServerError, match=r"server\.insecure"):
            check_open_server(hosts, {}, insecure=False)


def _config(tmp_path: Path, **server) -> str:
    config = {
        "model": {"path": str(DEMO)},
        "lora": {"registry": str(tmp_path / "registry")},
        "server": server,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _ingress_keys(app) -> dict:
    _, keys, _tenancy, _batch = app._bound_deployment.init_args
    return keys


def test_build_refuses_a_keyless_public_host(tmp_path, monkeypatch):
    """`serve run serving.deploy.app:build` and KubeRay call build(): it fails closed too."""
    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    with pytest.raises(OpenServerError, match=r"0\.0\.0\.0"):
        build({"config": _config(tmp_path, host="0.0.0.0")})
    app = build({"config": _config(tmp_path, host="0.0.0.0", insecure=True)})
    assert _ingress_keys(app) == {}


def test_build_passes_the_env_and_file_keys_to_the_ingress(tmp_path, monkeypatch):
    """Replicas on other nodes see neither the builder's env nor its files: the keys travel."""
    monkeypatch.setenv("LORASERVE_API_KEYS", f"{K1}:acme:user")
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"{K2} ops admin\n")
    app = build({"config": _config(tmp_path, host="0.0.0.0", api_keys_file=str(keys_file))})
    assert _ingress_keys(app) == {**KEY, K2: Principal("ops", "admin")}


def test_build_refuses_a_short_key_naming_its_tenant(tmp_path, monkeypatch):
    monkeypatch.setenv("LORASERVE_API_KEYS", f"{K1}:ops:admin,short-key-1234:acme:user")
    with pytest.raises(ConfigError) as info:
        build({"config": _config(tmp_path, host="0.0.0.0")})
    message = str(info.value)
    assert message.startswith("LORASERVE_API_KEYS, entry 2: the key of tenant 'acme' is shorter")
    assert "short-key-1234" not in message and "\n" not in message


def test_limits_for_a_tenant_no_key_names_are_warned_of(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LORASERVE_API_KEYS", f"{K1}:bob:user")
    path = Path(_config(tmp_path, host="127.0.0.1"))
    config = yaml.safe_load(path.read_text())
    config["limits"] = {"tenants": {"Bob": {"requests_per_minute": 5}, "bob": {}}}
    path.write_text(yaml.safe_dump(config))
    with caplog.at_level("WARNING", logger="loraserve"):
        build({"config": str(path)})
    warned = [r.getMessage() for r in caplog.records if "limits.tenants" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("limits.tenants.Bob: no API key belongs")
