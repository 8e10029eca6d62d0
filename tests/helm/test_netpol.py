"""The NetworkPolicy evaluator reads policies as Kubernetes does."""

from __future__ import annotations

import pytest

from tests.helm.netpol import EVERY_PORT, Pod, Source, open_ports, selects

NS = "apps"
WEB = Pod(NS, {"app": "web", "tier": "front"}, {"http": 8080})
NEIGHBOUR = Source.pod(NS, {"app": "cache"})
ELSEWHERE = Source.pod("other", {"app": "cache"})
OUTSIDE = Source.address("203.0.113.7")


def _policy(*rules, selector=None, namespace=NS, types=("Ingress",)) -> dict:
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {
            "podSelector": selector if selector is not None else {"matchLabels": {"app": "web"}},
            "policyTypes": list(types),
            "ingress": list(rules),
        },
    }


def test_no_policy_opens_every_port():
    assert open_ports([], WEB, OUTSIDE) == EVERY_PORT


def test_a_selecting_policy_with_no_rules_closes_everything():
    assert open_ports([_policy()], WEB, NEIGHBOUR) == frozenset()


def test_policies_of_other_pods_namespaces_or_egress_only_leave_it_open():
    others = [
        _policy(selector={"matchLabels": {"app": "db"}}),
        _policy(namespace="other"),
        _policy(types=("Egress",)),
    ]
    assert open_ports(others, WEB, OUTSIDE) == EVERY_PORT


def test_a_rule_without_from_admits_everyone_even_outside():
    # The regression this evaluator is for: `- ports: [8000]` with no `from`.
    policy = _policy({"ports": [{"port": 8000}]})
    assert open_ports([policy], WEB, OUTSIDE) == {8000}
    assert open_ports([policy], WEB, ELSEWHERE) == {8000}


def test_a_rule_without_ports_admits_every_port():
    policy = _policy({"from": [{"podSelector": {}}]})
    assert open_ports([policy], WEB, NEIGHBOUR) == EVERY_PORT


def test_a_pod_selector_alone_is_the_policys_namespace():
    policy = _policy({"from": [{"podSelector": {"matchLabels": {"app": "cache"}}}]})
    assert open_ports([policy], WEB, NEIGHBOUR) == EVERY_PORT
    assert open_ports([policy], WEB, ELSEWHERE) == frozenset()
    assert open_ports([policy], WEB, OUTSIDE) == frozenset()


def test_namespace_and_pod_selectors_in_one_peer_both_hold():
    peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
        "podSelector": {"matchLabels": {"app": "cache"}},
    }
    policy = _policy({"from": [peer], "ports": [{"port": 80}]})
    assert open_ports([policy], WEB, ELSEWHERE) == {80}
    assert open_ports([policy], WEB, Source.pod("other", {"app": "job"})) == frozenset()
    assert open_ports([policy], WEB, NEIGHBOUR) == frozenset()


def test_two_peers_are_either():
    peers = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}},
        {"podSelector": {"matchLabels": {"app": "cache"}}},
    ]
    policy = _policy({"from": peers, "ports": [{"port": 80}]})
    assert open_ports([policy], WEB, Source.pod("other", {"app": "job"})) == {80}
    assert open_ports([policy], WEB, NEIGHBOUR) == {80}


def test_ports_protocols_ranges_and_names():
    policy = _policy(
        {"ports": [{"port": 80}, {"port": 9000, "endPort": 9002}, {"port": "http"}]},
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": "nope"}]},
    )
    assert open_ports([policy], WEB, OUTSIDE) == {80, 9000, 9001, 9002, 8080}
    assert open_ports([policy], WEB, OUTSIDE, protocol="UDP") == {53}


def test_policies_add_up():
    a = _policy({"ports": [{"port": 80}]})
    b = _policy({"from": [{"podSelector": {}}], "ports": [{"port": 443}]})
    assert open_ports([a, b], WEB, NEIGHBOUR) == {80, 443}
    assert open_ports([a, b], WEB, OUTSIDE) == {80}


def test_ip_blocks_with_exceptions_match_any_address_in_them():
    block = {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}
    policy = _policy({"from": [block], "ports": [{"port": 80}]})
    assert open_ports([policy], WEB, OUTSIDE) == {80}
    assert open_ports([policy], WEB, Source.pod(NS, {}, ip="10.1.2.3")) == frozenset()
    # A pod address outside the exception counts as matched: the widest reading.
    assert open_ports([policy], WEB, Source.pod(NS, {}, ip="192.168.1.5")) == {80}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({}, True),
        ({"matchLabels": {"app": "web"}}, True),
        ({"matchLabels": {"app": "web", "tier": "back"}}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
    ],
)
def test_label_selectors(selector, matches):
    assert selects(selector, {"app": "web", "tier": "front"}) is matches
