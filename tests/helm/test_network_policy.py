"""The chart is closed by default: by NetworkPolicy semantics over the rendered objects, only
the release's pods reach Ray's ports, the KubeRay operator the head's dashboard, and the
sources the operator names the workers' serve port 8000 alone (the head serves no API)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from tests.helm.netpol import EVERY_PORT, Pod, Source, open_ports
from tests.helm.render import (
    CHART,
    NAMESPACE,
    find,
    notes,
    pod_templates,
    render,
    value_set,
    value_sets,
)

SERVE = frozenset({8000})
OPERATOR = frozenset({8265})  # the dashboard: the Serve app and its status
NONE = frozenset()
CLIENT_LABEL = "ls-loraserve-client"  # "<fullname>-client", as values.yaml and NOTES name it
RELEASE = {"app.kubernetes.io/name": "loraserve", "app.kubernetes.io/instance": "ls"}

# Sources outside the release that no value set lets past port 8000.
STRANGERS = {
    "a pod beside the release": Source.pod(NAMESPACE, {"app": "notebook"}),
    "another release of the chart": Source.pod(
        NAMESPACE, {**RELEASE, "app.kubernetes.io/instance": "other"}
    ),
    "a pod elsewhere with the release's labels": Source.pod(
        "tenant-b", {**RELEASE, "app.kubernetes.io/component": "ray-head"}
    ),
    "a pod elsewhere labelled as a client": Source.pod("tenant-b", {CLIENT_LABEL: "true"}),
    "a pod in the default namespace": Source.pod("default", {}),
    "an address outside the cluster": Source.address("203.0.113.7"),
}
OPERATOR_POD = {"app.kubernetes.io/name": "kuberay-operator"}
CLIENT = Source.pod(NAMESPACE, {CLIENT_LABEL: "true"})
INGRESS = Source.pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})


def _pods(objects: list[dict]) -> dict[str, Pod]:
    """The head and each worker group as the pods KubeRay makes from their templates."""
    pods = {}
    for group, template in pod_templates(objects).items():
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        pods[group] = Pod(NAMESPACE, template["metadata"]["labels"], ports)
    return pods


def _reach(objects: list[dict], source: Source, protocol: str = "TCP") -> dict[str, frozenset]:
    return {
        group: open_ports(objects, pod, source, protocol) for group, pod in _pods(objects).items()
    }


def _exposures(objects: list[dict], operator_namespace: str, sources: dict[str, Source]) -> list:
    """(source, pod, protocol, first ports, count) wherever a source outside the release
    reaches more than it may: a stranger nothing, a source a value set may name a worker's
    serve port 8000 (TCP), the operator's namespace the head's OPERATOR ports."""
    found = []
    for name, source in sources.items():
        for protocol in ("TCP", "UDP"):
            for group, ports in _reach(objects, source, protocol).items():
                serves = protocol == "TCP" and group != "head"  # replicas run on workers only
                allowed = SERVE if serves and name not in STRANGERS else NONE
                if source.namespace == operator_namespace and group == "head" and protocol == "TCP":
                    allowed = OPERATOR
                if ports - allowed:
                    extra = sorted(ports - allowed)
                    found.append((name, group, protocol, extra[:3], len(extra)))
    return found


def _outsiders(values: dict) -> dict[str, Source]:
    namespace = values.get("networkPolicy", {}).get("operatorNamespace", "kuberay-system")
    return {
        **STRANGERS,
        "the KubeRay operator": Source.pod(namespace, OPERATOR_POD),
        "another pod of the operator's namespace": Source.pod(namespace, {"app": "x"}),
        "the ingress controller": INGRESS,
        "a client of the release's namespace": CLIENT,
        "Prometheus": Source.pod("monitoring", {"app.kubernetes.io/name": "prometheus"}),
        "a gateway": Source.pod("gateway", {"app": "gateway"}),
    }


@pytest.mark.parametrize("name", value_sets())
def test_ray_ports_are_closed_to_everyone_outside_the_release(name):
    values = value_set(name)
    objects = render(values)
    namespace = values.get("networkPolicy", {}).get("operatorNamespace", "kuberay-system")
    assert _exposures(objects, namespace, _outsiders(values)) == []
    for group, pod in _pods(objects).items():  # Ray itself: every port between its pods
        source = Source.pod(NAMESPACE, pod.labels)
        assert _reach(objects, source) == {g: EVERY_PORT for g in _pods(objects)}, group


def test_defaults_admit_exactly_the_operator_the_ingress_and_labelled_clients():
    objects = render(value_set("default"))  # no networkPolicy key: the chart's defaults
    head_and_worker = {"head", "gpu"}
    assert set(_pods(objects)) == head_and_worker
    expected = {
        "the KubeRay operator": {"head": OPERATOR, "gpu": NONE},
        "another pod of the operator's namespace": {"head": OPERATOR, "gpu": NONE},
        "the ingress controller": {"head": NONE, "gpu": SERVE},
        "a client of the release's namespace": {"head": NONE, "gpu": SERVE},
        "Prometheus": {"head": NONE, "gpu": NONE},
        "a gateway": {"head": NONE, "gpu": NONE},
        **{name: {"head": NONE, "gpu": NONE} for name in STRANGERS},
    }
    reach = {name: _reach(objects, source) for name, source in _outsiders({}).items()}
    assert reach == expected


def test_the_serve_sources_are_the_operators_list():
    # one-gpu adds Prometheus; multi-gpu replaces the ingress with gateways and moves the operator.
    one_gpu = render(value_set("one-gpu"))
    assert _reach(one_gpu, INGRESS) == {"head": NONE, "gpu": SERVE}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert _reach(one_gpu, Source.pod("monitoring", prometheus))["gpu"] == SERVE
    assert _reach(one_gpu, Source.pod("monitoring", {"app": "grafana"}))["gpu"] == NONE

    multi = render(value_set("multi-gpu-autoscaling-s3"))
    for namespace in ("gateway", "gateway-canary"):
        assert _reach(multi, Source.pod(namespace, {}))["gpu"] == SERVE
    assert _reach(multi, Source.pod("gateway-dev", {}))["gpu"] == NONE
    assert _reach(multi, INGRESS)["gpu"] == NONE
    assert _reach(multi, Source.pod("ray-system", OPERATOR_POD))["head"] == OPERATOR
    assert _reach(multi, Source.pod("kuberay-system", OPERATOR_POD))["head"] == NONE


def test_an_ip_block_opens_the_serve_port_to_addresses_and_nothing_else():
    values = copy.deepcopy(value_set("default"))
    block = {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}
    values["networkPolicy"] = {"serveFrom": [block]}
    objects = render(values)
    for policy in find(objects, "NetworkPolicy"):
        kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    assert _reach(objects, Source.address("203.0.113.7")) == {"head": NONE, "gpu": SERVE}
    assert _reach(objects, Source.address("10.3.0.1")) == {"head": NONE, "gpu": NONE}
    assert _reach(objects, INGRESS) == {"head": NONE, "gpu": NONE}  # the list replaced
    others = {k: v for k, v in _outsiders(values).items() if k != "an address outside the cluster"}
    assert _exposures(objects, "kuberay-system", others) == []  # pods are in 10.0.0.0/8


def test_an_empty_serve_list_leaves_labelled_clients_only():
    values = copy.deepcopy(value_set("default"))
    values["networkPolicy"] = {"serveFrom": []}
    objects = render(values)
    assert _reach(objects, CLIENT) == {"head": NONE, "gpu": SERVE}
    assert _reach(objects, INGRESS) == {"head": NONE, "gpu": NONE}


def test_the_check_catches_an_open_serve_rule_and_an_operator_on_every_port():
    # A policy the chart once rendered: the operator's namespace on every port, and a
    # `- ports: [8000]` rule with no `from`, which admits any source at all, head included.
    objects = render(value_set("default"))
    objects = [o for o in objects if o["kind"] != "NetworkPolicy"]
    release = {"podSelector": {"matchLabels": RELEASE}}
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}
    }
    spec = {
        "podSelector": {"matchLabels": RELEASE},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [release, operator]}, {"ports": [{"port": 8000, "protocol": "TCP"}]}],
    }
    old = {
        "kind": "NetworkPolicy",
        "metadata": {"name": "ls", "namespace": NAMESPACE},
        "spec": spec,
    }
    exposures = _exposures([*objects, old], "kuberay-system", _outsiders({}))
    assert ("the KubeRay operator", "head", "TCP", [1, 2, 3], 65534) in exposures
    assert ("an address outside the cluster", "gpu", "TCP", [8000], 1) in exposures
    assert ("an address outside the cluster", "head", "TCP", [8000], 1) in exposures
    assert _reach([*objects, old], Source.address("203.0.113.7")) == {"head": SERVE, "gpu": SERVE}
    assert _exposures(objects, "kuberay-system", _outsiders({}))  # and no policy at all


def test_the_policy_is_on_unless_turned_off():
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert defaults["networkPolicy"]["enabled"] is True
    assert len(find(render(value_set("default")), "NetworkPolicy")) == 3
    assert "WARNING" not in notes(value_set("default"))

    values = copy.deepcopy(value_set("default"))
    values["networkPolicy"] = {"enabled": False}
    objects = render(values)
    assert find(objects, "NetworkPolicy") == []
    assert _reach(objects, Source.address("203.0.113.7")) == {"head": EVERY_PORT, "gpu": EVERY_PORT}
    assert "WARNING: networkPolicy.enabled: false" in notes(values)


def test_notes_name_the_client_label():
    text = notes(value_set("default"))
    assert f"{CLIENT_LABEL}=true" in text and "networkPolicy.serveFrom" in text
