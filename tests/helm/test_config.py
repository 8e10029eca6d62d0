"""The config the chart renders is one loraserve accepts, and agrees with the cluster around it."""

from __future__ import annotations

import hashlib
import json
from typing import get_args, get_origin

import fsspec
import jsonschema
import pytest
from pydantic import BaseModel

from serving.api.core.keys_file import load_keys
from serving.config import ConfigError, ServeConfig, parse_config
from serving.deploy.exposure import check_open_server
from serving.model.checkpoint import resolve_model_path
from tests.helm.render import (
    CHART,
    find,
    pod_templates,
    ray_containers,
    render,
    server_config,
    value_set,
    value_sets,
)

# Fields the chart decides from the cluster; values.schema.json must not let `config` set them.
CHART_OWNED = {
    ("model", "path"),
    ("draft", "path"),
    ("lora", "registry"),
    ("lora", "preload"),
    ("server", "host"),
    ("server", "port"),
    ("server", "insecure"),
    ("server", "api_keys_file"),
    ("deploy",),
    ("batch", "store"),
    ("usage",),
}


@pytest.fixture(scope="module", params=value_sets())
def rendered(request):
    return request.param, render(value_set(request.param))


def test_config_validates_with_loraserve_model(rendered):
    name, objects = rendered
    cfg = parse_config(server_config(objects))
    values = value_set(name)
    assert cfg.server.host == "0.0.0.0"
    assert cfg.server.insecure is bool(values.get("insecure", False))
    assert cfg.server.api_keys_file is None
    assert cfg.deploy.ray_address is None
    assert cfg.model.path.is_absolute()
    assert cfg.usage.store.startswith("sqlite:////") and cfg.batch.store.startswith("sqlite:////")
    if values.get("registry", {}).get("type", "s3") == "s3":
        assert cfg.lora.registry == values["registry"]["s3"]["uri"]
    else:
        assert cfg.lora.registry == "file:///registry"


def test_config_is_open_only_when_insecure(rendered):
    name, objects = rendered
    cfg = parse_config(server_config(objects))
    for container in ray_containers(objects):
        has_keys = any(e["name"] == "LORASERVE_API_KEYS" for e in container["env"])
        assert has_keys is not cfg.server.insecure, (name, container["name"])
    if cfg.server.insecure:  # the app's own rule, as the builder applies it in the cluster
        check_open_server([cfg.server.host], {}, cfg.server.insecure)


def test_keys_secret_parses_as_the_app_reads_it():
    values = value_set("default")
    objects = render(values)
    (secret,) = find(objects, "Secret")
    keys = load_keys(None, env=secret["stringData"])
    assert {k: (p.tenant, p.scope) for k, p in keys.items()} == {
        k["key"]: (k["tenant"], k["scope"]) for k in values["apiKeys"]["keys"]
    }
    for container in ray_containers(objects):
        ref = next(e for e in container["env"] if e["name"] == "LORASERVE_API_KEYS")
        assert ref["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": "LORASERVE_API_KEYS",
        }


def test_existing_keys_secret_is_referenced_not_made():
    objects = render(value_set("one-gpu"))
    assert find(objects, "Secret") == []
    for container in ray_containers(objects):
        ref = next(e for e in container["env"] if e["name"] == "LORASERVE_API_KEYS")
        assert ref["valueFrom"]["secretKeyRef"]["name"] == "loraserve-keys"


def test_config_change_rolls_the_pods():
    values = value_set("default")
    before = pod_templates(render(values))["head"]["metadata"]["annotations"]
    values["config"] = {"scheduler": {"max_num_seqs": 7}}
    after = pod_templates(render(values))["head"]["metadata"]["annotations"]
    assert before["checksum/config"] != after["checksum/config"]


def test_s3_weights_land_where_the_config_points(tmp_path):
    """The init container runs resolve_model_path(uri, mountPath); model.path must be its answer."""
    values = value_set("multi-gpu-autoscaling-s3")
    objects = render(values)
    cfg = parse_config(server_config(objects))
    uri, mount = values["weights"]["s3"]["uri"], "/models"
    assert str(cfg.model.path) == f"{mount}/{hashlib.sha256(uri.encode()).hexdigest()}"
    worker = pod_templates(objects)["gpu"]["spec"]
    (init,) = worker["initContainers"]
    assert init["command"][-2:] == [uri, mount]
    assert {"name": "weights", "mountPath": mount} in init["volumeMounts"]
    # The same rule, run for real on an in-memory filesystem.
    fs = fsspec.filesystem("memory")
    fs.pipe("/chart-test/model/config.json", b"{}")
    copied = resolve_model_path("memory://chart-test/model", tmp_path)
    assert copied == tmp_path / hashlib.sha256(b"memory://chart-test/model").hexdigest()
    assert (copied / "config.json").is_file()


def test_weights_only_where_they_are_read():
    # Without preloads or a draft model the builder on the head reads no model file.
    head = pod_templates(render(value_set("multi-gpu-autoscaling-s3")))["head"]["spec"]
    assert "initContainers" not in head
    assert "weights" not in {v["name"] for v in head["volumes"]}
    # cpu-dev preloads adapters and drafts with a model: the head mounts the weights.
    objects = render(value_set("cpu-dev"))
    cfg = parse_config(server_config(objects))
    head = pod_templates(objects)["head"]["spec"]
    assert "weights" in {v["name"] for v in head["volumes"]}
    assert str(cfg.draft.path) == "/models/demo/draft"
    assert {str(p) for p in cfg.lora.preload.values()} == {
        "/models/demo/adapters/upper",
        "/models/demo/adapters/comment",
    }


# One path per config key; "*" stands for any tenant's name under limits.tenants.
def _schema_paths(schema: dict, prefix: tuple = ()) -> set[tuple]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add((*prefix, key))
        paths |= _schema_paths(sub, (*prefix, key))
    if isinstance(schema.get("additionalProperties"), dict):
        paths |= _schema_paths(schema["additionalProperties"], (*prefix, "*"))
    return paths


def _model_paths(model: type[BaseModel], prefix: tuple = ()) -> set[tuple]:
    paths = set()
    for key, field in model.model_fields.items():
        paths.add((*prefix, key))
        kind, inner = field.annotation, (*prefix, key)
        if get_origin(kind) is dict and isinstance(get_args(kind)[1], type):
            kind, inner = get_args(kind)[1], (*inner, "*")
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            paths |= _model_paths(kind, inner)
    return paths


def _config_schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]


def _settable() -> set[tuple]:
    """The config keys a chart user may set: every one the models have, less the chart's."""
    owned = lambda path: any(path[: len(o)] == o for o in CHART_OWNED)  # noqa: E731
    return {path for path in _model_paths(ServeConfig) if not owned(path)}


def test_values_config_schema_is_serve_config_less_the_chart_owned_keys():
    allowed = _schema_paths(_config_schema())
    assert allowed <= _model_paths(ServeConfig), allowed - _model_paths(ServeConfig)
    for owned in CHART_OWNED:
        assert owned not in allowed, owned
    assert allowed == _settable(), f"values.schema.json lacks {_settable() - allowed}"


# Values tried on every key: each JSON kind, the edges of the numbers and names the models use.
PROBES = (None, True, False, 0, 1, -1, 2, 0.5, 1.5, 16, 17, 64, 65535, 65536, 100_000, "auto",
          "", "x", "fp8", "int4", "bfloat16", "ngram", "a" * 64, "a" * 65, "-x", "a:b", {}, [])  # fmt: skip


def _nest(path: tuple, value) -> dict:
    for part in reversed(path):
        value = {"acme" if part == "*" else part: value}
    return value


def _kind(value) -> str:
    return {bool: "boolean", int: "number", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _leaves() -> list[tuple]:
    """The settable keys that hold a value rather than a section."""
    keys = _settable()
    return sorted(p for p in keys if not any(q[: len(p)] == p and q != p for q in keys))


@pytest.mark.parametrize("path", _leaves(), ids=".".join)
def test_values_config_schema_takes_what_loraserve_takes(path):
    """The schema refuses no value the server takes as written (a typed YAML value), and lets
    through no value the server refuses for that key; rules across keys are the server's."""
    validator = jsonschema.Draft7Validator(_config_schema())
    where = tuple("acme" if p == "*" else p for p in path)
    for value in PROBES:
        data = _nest(path, value)
        try:
            dumped = parse_config(data).model_dump(mode="json")
            for part in where:
                dumped = dumped[part]
            taken, as_written = True, _kind(dumped) == _kind(value) and dumped == value
        except ConfigError as exc:
            taken = f"{'.'.join(where)}:" not in str(exc)  # refused for another key's sake
            as_written = False
        valid = validator.is_valid(data)
        assert not valid or taken, f"the chart lets {'.'.join(where)}: {value!r} through"
        assert valid or not as_written, f"the chart refuses {'.'.join(where)}: {value!r}"


def test_values_config_schema_checks_tenant_names_as_loraserve_does():
    validator = jsonschema.Draft7Validator(_config_schema())
    for name in ("acme", "a.b_c-d", "a" * 64, "a" * 65, "-x", "a:b", ""):
        data = {"limits": {"tenants": {name: {}}}}
        try:
            parse_config(data)
            taken = True
        except ConfigError:
            taken = False
        assert validator.is_valid(data) is taken, name
