"""The chart renders, lints and validates for every value set in tests/helm/values."""

from __future__ import annotations

import importlib

import kubernetes_validate
import pytest
from ray.serve.schema import ServeDeploySchema

from tests.helm.render import (
    find,
    lint,
    notes,
    pod_templates,
    render,
    serve_config,
    server_config,
    value_set,
    value_sets,
)

# The newest Kubernetes whose schemas kubernetes-validate ships.
K8S_VERSION = kubernetes_validate.latest_version()
# Validated by their operators' CRDs, not by Kubernetes' own schemas.
CUSTOM_KINDS = {"RayService", "ServiceMonitor"}
SETS = value_sets()


@pytest.fixture(scope="module", params=SETS)
def rendered(request):
    return request.param, render(value_set(request.param))


def test_the_value_sets_are_there():
    assert {"default", "cpu-dev", "one-gpu", "multi-gpu-autoscaling-s3"} <= set(SETS)


@pytest.mark.parametrize("name", SETS)
def test_lints_clean(name):
    assert lint(value_set(name)) == []


def test_every_value_set_renders_the_core_objects(rendered):
    _, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {"RayService", "ConfigMap", "PersistentVolumeClaim"} <= kinds


def _validate(obj: dict) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {where}: {exc.message}")


def test_core_objects_validate_strictly(rendered):
    _, objects = rendered
    core = [o for o in objects if o["kind"] not in CUSTOM_KINDS]
    assert core
    for obj in core:
        _validate(obj)


def test_pod_templates_validate_as_pod_templates(rendered):
    _, objects = rendered
    for group, template in pod_templates(objects).items():
        _validate(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"ray-{group}"},
                "template": template,
            }
        )


def test_the_serve_service_validates_as_a_service(rendered):
    _, objects = rendered
    service = find(objects, "RayService")[0]["spec"]["serveService"]
    _validate(service)
    assert service["spec"]["ports"][0]["targetPort"] == 8000
    assert service["spec"]["ports"][0]["name"] == "serve"  # what KubeRay looks for


def test_rayservice_kind_and_serve_config(rendered):
    _, objects = rendered
    (service,) = find(objects, "RayService")
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    assert isinstance(service["spec"]["serveConfigV2"], str)
    schema = ServeDeploySchema.model_validate(serve_config(objects))
    (app,) = schema.applications
    assert app.import_path == "serving.deploy.app:build"
    assert app.route_prefix == "/"
    assert app.args == {"config": "/etc/loraserve/config.yaml"}
    module, attr = app.import_path.split(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_the_config_file_is_mounted_where_the_app_reads_it(rendered):
    _, objects = rendered
    (config_map,) = find(objects, "ConfigMap")
    path = serve_config(objects)["applications"][0]["args"]["config"]
    folder, file = path.rsplit("/", 1)
    assert file in config_map["data"]
    for template in pod_templates(objects).values():
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "config")
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
        mounts = template["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "config", "mountPath": folder, "readOnly": True} in mounts


def test_workers_match_the_config_replicas_and_gpus(rendered):
    name, objects = rendered
    values = value_set(name)
    deploy = server_config(objects)["deploy"]
    cluster = find(objects, "RayService")[0]["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == deploy["num_replicas"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert group["rayStartParams"]["num-gpus"] == str(deploy["resources"]["num_gpus"])
    assert group["rayStartParams"]["num-cpus"] == str(deploy["resources"]["num_cpus"])
    resources = group["template"]["spec"]["containers"][0]["resources"]
    gpus = deploy["resources"]["num_gpus"]
    if gpus:
        assert resources["limits"]["nvidia.com/gpu"] == gpus
        assert resources["requests"]["nvidia.com/gpu"] == gpus
    else:
        assert "nvidia.com/gpu" not in resources.get("limits", {})
    assert cluster["enableInTreeAutoscaling"] == values.get("autoscaling", {}).get("enabled", False)
    if name == "cpu-dev":
        assert gpus == 0
    elif name == "multi-gpu-autoscaling-s3":
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (4, 2, 8)


def test_head_has_no_app_probe(rendered):
    _, objects = rendered
    head = find(objects, "RayService")[0]["spec"]["rayClusterConfig"]["headGroupSpec"]
    container = head["template"]["spec"]["containers"][0]
    assert "readinessProbe" not in container  # KubeRay deploys the app once the head is ready


def test_pods_run_non_root_on_a_read_only_root(rendered):
    _, objects = rendered
    for template in pod_templates(objects).values():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        home = next(e["value"] for e in spec["containers"][0]["env"] if e["name"] == "HOME")
        assert {"/tmp", "/tmp/ray", home} <= mounts


def test_stores_on_the_head_only(rendered):
    _, objects = rendered
    config = server_config(objects)
    for group, template in pod_templates(objects).items():
        mounts = {
            m["name"]: m["mountPath"] for m in template["spec"]["containers"][0]["volumeMounts"]
        }
        if group == "head":
            assert config["usage"]["store"] == f"sqlite:///{mounts['stores']}/usage.db"
            assert config["batch"]["store"] == f"sqlite:///{mounts['stores']}/batch.db"
        else:
            assert "stores" not in mounts


def test_worker_disruption_budget_selects_workers(rendered):
    name, objects = rendered
    budgets = find(objects, "PodDisruptionBudget")
    if name == "cpu-dev":
        assert budgets == []
        return
    (budget,) = budgets
    labels = pod_templates(objects)["gpu"]["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert selector["app.kubernetes.io/component"] == "ray-worker"


def test_ingress_and_service_monitor_reach_the_serve_service():
    objects = render(value_set("one-gpu"))
    service = find(objects, "RayService")[0]["spec"]["serveService"]
    (ingress,) = find(objects, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"number": 8000}}
    (monitor,) = find(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("serve", "/metrics")


def test_notes_tell_how_to_call_it():
    text = notes(value_set("default"))
    assert "port-forward svc/ls-loraserve-serve" in text
    assert "curl" in text and "Authorization: Bearer" in text
    assert "WARNING" in notes(value_set("cpu-dev"))
