"""Clients reach the replicas' own listeners: Ray Serve runs no HTTP proxy, each worker pod's
replica listens on the config's server.host:server.port, that port is the one KubeRay's serve
Service targets, a worker is an endpoint while its replica answers /readyz, and the head,
which runs no replica, never is one.

KubeRay decides the endpoints; its rules are modelled here from its source
(ray-project/kuberay, ray-operator/controllers/ray): the serve Service selects the cluster's
pods labelled ray.io/serve=true (common/service.go BuildServeService). Every RayService
worker carries that label, so readiness alone decides (common/pod.go BuildPod); a worker
container without a readiness probe gets KubeRay's, which asks a Serve proxy's /-/healthz
(common/pod.go initLivenessAndReadinessProbe). The head's label is "false" when
excludeHeadPodFromServeSvc is set, else whether its Serve proxy answers /-/healthz
(rayservice_controller.go updateHeadPodServeLabel).
"""

from __future__ import annotations

import copy

import pytest
from ray.serve.config import ProxyLocation
from ray.serve.schema import ServeDeploySchema

from tests.helm.render import (
    find,
    pod_templates,
    render,
    serve_config,
    server_config,
    value_set,
    value_sets,
)

KUBERAY_SERVE_PROBE = {"exec": {"command": ["bash", "-c", "wget ... localhost:8000/-/healthz"]}}


def head_serve_label(rayservice: dict, proxy_answers: bool) -> str:
    """The ray.io/serve label KubeRay keeps on the head pod: "true" makes it an endpoint."""
    if rayservice["spec"].get("excludeHeadPodFromServeSvc", False):
        return "false"
    return str(proxy_answers).lower()


def worker_readiness(container: dict) -> dict:
    """The readiness probe a RayService worker runs: its container's own, else KubeRay's."""
    return container.get("readinessProbe") or KUBERAY_SERVE_PROBE


def serve_port(container: dict) -> int:
    """The container's port named serve, the one KubeRay's serve Service is built on."""
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "serve"]
    return port


@pytest.fixture(scope="module", params=value_sets())
def rendered(request):
    return request.param, render(value_set(request.param))


def _workers(objects: list[dict]) -> list[dict]:
    return [t["spec"]["containers"][0] for g, t in pod_templates(objects).items() if g != "head"]


def test_serve_runs_no_http_proxy(rendered):
    _, objects = rendered
    schema = ServeDeploySchema.model_validate(serve_config(objects))
    assert schema.proxy_location == ProxyLocation.Disabled
    assert "http_options" not in serve_config(objects)  # nothing would read them


def test_replicas_listen_on_the_port_the_serve_service_targets(rendered):
    _, objects = rendered
    server = server_config(objects)["server"]
    assert server["host"] == "0.0.0.0"  # the pod's address, where the Service sends clients
    service = find(objects, "RayService")[0]["spec"]["serveService"]
    (port,) = service["spec"]["ports"]
    assert port["name"] == "serve"
    assert port["targetPort"] == server["port"]
    head = pod_templates(objects)["head"]["spec"]["containers"][0]
    assert serve_port(head) == server["port"]  # KubeRay takes the Service's port from it
    for worker in _workers(objects):
        assert serve_port(worker) == server["port"]


def test_a_worker_is_an_endpoint_while_its_replica_answers_readyz(rendered):
    _, objects = rendered
    port = server_config(objects)["server"]["port"]
    for worker in _workers(objects):
        probe = worker_readiness(worker)
        assert probe["httpGet"] == {"path": "/readyz", "port": port}
        assert probe["failureThreshold"] >= 1 and probe["periodSeconds"] >= 1


def test_the_head_is_never_a_serve_endpoint(rendered):
    _, objects = rendered
    (rayservice,) = find(objects, "RayService")
    # Even were something to answer /-/healthz on the head, KubeRay keeps it out.
    assert head_serve_label(rayservice, proxy_answers=True) == "false"
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # so no ModelServer replica lands there


def test_a_readiness_probe_from_values_replaces_the_charts():
    values = copy.deepcopy(value_set("default"))
    own = {"httpGet": {"path": "/readyz", "port": 8000}, "periodSeconds": 2, "failureThreshold": 3}
    values.setdefault("workers", {})["readinessProbe"] = own
    (worker,) = _workers(render(values))
    assert worker_readiness(worker) == own


def test_the_model_tells_the_old_topology_apart():
    # The chart once rendered no worker probe and no excludeHeadPodFromServeSvc.
    old = {"spec": {}}
    assert head_serve_label(old, proxy_answers=True) == "true"
    assert "httpGet" not in worker_readiness({"ports": []})
