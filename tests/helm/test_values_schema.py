"""Bad values fail `helm template` and `helm lint` with a message naming the problem."""

from __future__ import annotations

import copy

import helm_python as helm
import pytest

from tests.helm.render import lint, render, value_set


def _with(base: str, **changes) -> dict:
    """A value set with dotted keys replaced (a value of ... deletes the key)."""
    values = copy.deepcopy(value_set(base))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return values


KEY = {"key": "sk-0123456789abcdef", "tenant": "acme", "scope": "user"}

# (values, words the error must contain): refused by values.schema.json.
SCHEMA_REFUSALS = {
    "unknown top-level key": (_with("default", replicas=2), "replicas"),
    "unknown nested key": (_with("default", workers__gpus=1), "gpus"),
    "unknown config key": (_with("default", config={"model": {"idd": "x"}}), "idd"),
    "chart-owned config key": (_with("default", config={"deploy": {"num_replicas": 2}}), "deploy"),
    "negative replicas": (_with("default", workers__replicas=-1), "replicas"),
    "zero replicas": (_with("default", workers__replicas=0), "replicas"),
    "negative gpus": (_with("default", workers__gpusPerReplica=-1), "gpusPerReplica"),
    "bad scope": (_with("default", apiKeys__keys=[{**KEY, "scope": "root"}]), "scope"),
    "reserved tenant": (_with("default", apiKeys__keys=[{**KEY, "tenant": "operator"}]), "tenant"),
    "short key": (_with("default", apiKeys__keys=[{**KEY, "key": "short"}]), "key"),
    "key with a colon": (
        _with("default", apiKeys__keys=[{**KEY, "key": "sk:0123456789abcdef"}]),
        "key",
    ),
    "wrong type": (_with("default", workers__replicas="two"), "replicas"),
    "wrong type in config": (
        _with("default", config={"cache": {"prefix_caching": "yes"}}),
        "prefix_caching",
    ),
    "bad enum": (_with("default", weights__source="http"), "source"),
    "bad quantization": (
        _with("default", config={"model": {"quantization": "int4"}}),
        "quantization",
    ),
    "registry not s3": (_with("default", registry__s3={"uri": "gs://bucket/x"}), "uri"),
    "path escaping the volume": (_with("default", weights__modelPath="../etc"), "modelPath"),
    "network policy switch not a boolean": (
        _with("default", networkPolicy__enabled="no"),
        "networkPolicy/enabled",
    ),
    "serve source not a list": (
        _with("default", networkPolicy__serveFrom={"namespaceSelector": {}}),
        "networkPolicy/serveFrom",
    ),
    "serve source with an unknown key": (
        _with("default", networkPolicy__serveFrom=[{"namespace": "web"}]),
        "namespace",
    ),
    "empty serve source": (_with("default", networkPolicy__serveFrom=[{}]), "serveFrom/0"),
    "ipBlock beside a selector": (
        _with(
            "default",
            networkPolicy__serveFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}],
        ),
        "serveFrom/0",
    ),
    "ipBlock without a cidr": (
        _with("default", networkPolicy__serveFrom=[{"ipBlock": {"except": ["10.1.0.0/16"]}}]),
        "cidr",
    ),
    "ipBlock not a cidr": (
        _with("default", networkPolicy__serveFrom=[{"ipBlock": {"cidr": "everyone"}}]),
        "cidr",
    ),
    "bad selector operator": (
        _with(
            "default",
            networkPolicy__serveFrom=[
                {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Is"}]}}
            ],
        ),
        "operator",
    ),
}

# Refused by a template's `fail`: rules spanning several values.
TEMPLATE_REFUSALS = {
    "no keys without insecure": (_with("default", apiKeys__keys=[]), "no API keys"),
    "keys twice": (_with("default", apiKeys__keys=[KEY, KEY]), "twice"),
    "keys and an existing secret": (
        _with("default", apiKeys__existingSecret={"name": "mine"}),
        "not both",
    ),
    "no weights claim": (_with("default", weights__pvc={"claimName": ""}), "claimName"),
    "no weights uri": (_with("default", weights__source="s3"), "weights.s3.uri"),
    "no registry uri": (_with("default", registry__s3={"uri": ""}), "registry.s3.uri"),
    "draft model without a path": (
        _with("default", config={"draft": {"method": "draft_model"}}),
        "weights.draftPath",
    ),
    "autoscaling max below replicas": (
        _with(
            "default",
            workers__replicas=4,
            autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 2},
        ),
        "maxReplicas",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_REFUSALS))
def test_schema_refuses(case):
    values, words = SCHEMA_REFUSALS[case]
    with pytest.raises(helm.HelmValuesError, match=words):
        render(values)
    findings = lint(values)
    assert findings and all(f["severity"] == 3 for f in findings)
    assert any(words in f["error"] for f in findings)


@pytest.mark.parametrize("case", sorted(TEMPLATE_REFUSALS))
def test_template_refuses(case):
    values, words = TEMPLATE_REFUSALS[case]
    with pytest.raises(helm.HelmRenderError, match=words):
        render(values)


def test_insecure_is_the_only_way_to_no_keys():
    values = _with("default", apiKeys__keys=[], insecure=True)
    objects = render(values)
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_defaults_alone_fail_closed():
    with pytest.raises(helm.HelmRenderError, match="no API keys"):
        render({})
