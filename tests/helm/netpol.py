"""Which sources may open which TCP/UDP ports of a pod, by Kubernetes NetworkPolicy semantics.

An evaluator of the ingress half of networking.k8s.io/v1 NetworkPolicy over rendered objects,
so tests state who reaches what rather than what the YAML says:

    head = Pod(NAMESPACE, labels, named_ports)
    open_ports(policies, head, Source.pod("default", {"app": "x"}))   # -> frozenset of ports

Where the API leaves a choice to the network plugin it takes the widest reading, so that it
never reports a port closed that some plugin would open: an ipBlock matches pod addresses
too. Traffic from the pod's own node (kubelet probes), which every plugin admits, is not a
source here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

EVERY_PORT = frozenset(range(1, 65536))
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: a pod (its namespace and labels) or, with namespace
    None, an address that is no pod of the cluster."""

    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    namespace_labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def pod(cls, namespace: str, labels: Mapping[str, str], ip: str = "10.244.9.9") -> Source:
        """A pod; its namespace carries the label Kubernetes puts on every namespace."""
        return cls(ip, namespace, dict(labels), {NAMESPACE_NAME_LABEL: namespace})

    @classmethod
    def address(cls, ip: str) -> Source:
        """A client outside the cluster's pods (a load balancer, a node, the internet)."""
        return cls(ip)


@dataclass(frozen=True)
class Pod:
    """The pod a connection goes to: its namespace, labels and named container ports."""

    namespace: str
    labels: Mapping[str, str] = field(hash=False)
    named_ports: Mapping[str, int] = field(default_factory=dict, hash=False)


def selects(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector matches these labels ({} matches everything)."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op not in {"In", "NotIn", "Exists", "DoesNotExist"}:
            raise ValueError(f"unknown selector operator {op!r}")
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _peer_admits(peer: Mapping, policy_namespace: str, source: Source) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(source.ip)
        if ip not in ipaddress.ip_network(block["cidr"], strict=False):
            return False
        return not any(ip in ipaddress.ip_network(c, strict=False) for c in block.get("except", []))
    if source.namespace is None:  # selectors pick pods only
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:  # a podSelector alone: the policy's namespace
        return False
    return selects(peer.get("podSelector"), source.labels)


def _rule_ports(rule: Mapping, target: Pod, protocol: str) -> frozenset[int]:
    if not rule.get("ports"):
        return EVERY_PORT
    ports: set[int] = set()
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != protocol:
            continue
        port = entry.get("port")
        if port is None:
            return EVERY_PORT
        if isinstance(port, str):
            if port not in target.named_ports:  # a name no container port has matches nothing
                continue
            port = target.named_ports[port]
        ports.update(range(port, entry.get("endPort", port) + 1))
    return frozenset(ports)


def _isolates(policy: Mapping, target: Pod) -> bool:
    """Whether this policy selects the pod for ingress (policyTypes default to Ingress)."""
    spec = policy["spec"]
    if policy["metadata"].get("namespace", target.namespace) != target.namespace:
        return False
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return False
    return selects(spec.get("podSelector"), target.labels)


def open_ports(
    objects: list[Mapping], target: Pod, source: Source, protocol: str = "TCP"
) -> frozenset[int]:
    """The ports of `target` that `source` may connect to under the NetworkPolicies among
    `objects`: every port when none selects the pod, else the union of what their rules admit."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy" and _isolates(o, target)]
    if not policies:
        return EVERY_PORT
    ports: set[int] = set()
    for policy in policies:
        namespace = policy["metadata"].get("namespace", target.namespace)
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            if not peers or any(_peer_admits(p, namespace, source) for p in peers):
                ports |= _rule_ports(rule, target, protocol)
    return frozenset(ports)
