"""Render and lint helm/loraserve offline, with Helm embedded (helm-python-sdk): no binary,
no cluster.

    objects = render(value_set("one-gpu"))
    service = find(objects, "RayService")[0]
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])   # a YAML string
    config = yaml.safe_load(find(objects, "ConfigMap")[0]["data"]["config.yaml"])

render() raises helm_python.HelmError (HelmValuesError when values.schema.json refuses the
values, HelmRenderError when a template's `fail` does), with Helm's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "loraserve"
VALUES = Path(__file__).resolve().parent / "values"
NAMESPACE = "serving"

helm.disable_logging()  # lint mode logs each `fail` it skips to stderr


def value_sets() -> list[str]:
    """The names of the value sets in tests/helm/values (file names without .yaml)."""
    return sorted(p.stem for p in VALUES.glob("*.yaml"))


def value_set(name: str) -> dict[str, Any]:
    """One value set, as a dict of values."""
    return yaml.safe_load((VALUES / f"{name}.yaml").read_text()) or {}


def render(values: dict | None = None, name: str = "ls") -> list[dict]:
    """Every object the chart renders for these values (merged over values.yaml), in
    template order; NOTES.txt is left out."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=name, namespace=NAMESPACE, is_install=True)
    objects = []
    for path in sorted(manifests):
        if path.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(manifests[path]) if doc]
    return objects


def notes(values: dict | None = None, name: str = "ls") -> str:
    """The rendered NOTES.txt."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=name, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def lint(values: dict | None = None) -> list[dict]:
    """`helm lint --strict` findings above info level: [{severity, path, error}]; [] is clean.

    Helm lints with `fail` switched off, so only render() shows a refusal by a template.
    """
    report = helm.lint(CHART, values or {}, strict=True, namespace=NAMESPACE)
    return [m for m in report["messages"] if m["severity"] > 1]


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    """The objects of this kind (and name, if given)."""
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def serve_config(objects: list[dict]) -> dict:
    """The RayService's serveConfigV2, parsed (it is a YAML string in the object)."""
    return yaml.safe_load(find(objects, "RayService")[0]["spec"]["serveConfigV2"])


def server_config(objects: list[dict]) -> dict:
    """The loraserve config carried by the ConfigMap (config.yaml), parsed."""
    (config_map,) = find(objects, "ConfigMap")
    return yaml.safe_load(config_map["data"]["config.yaml"])


def pod_templates(objects: list[dict]) -> dict[str, dict]:
    """{"head": template, <worker group name>: template} of the RayService."""
    cluster = find(objects, "RayService")[0]["spec"]["rayClusterConfig"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster["workerGroupSpecs"]:
        templates[group["groupName"]] = group["template"]
    return templates


def ray_containers(objects: list[dict]) -> list[dict]:
    """The Ray container of every pod template (each template's first container)."""
    return [t["spec"]["containers"][0] for t in pod_templates(objects).values()]
