"""The import direction of the architecture, checked on the source: no package reaches upward."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"kernels", "adapters", "serving"}
# package -> the packages of ours it may import
ALLOWED = {"kernels": {"kernels"}, "adapters": {"adapters", "kernels"}, "serving": OURS}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _sources(package: str):
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package):
    for path in _sources(package):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in OURS:
                assert top in ALLOWED[package], f"{path.relative_to(ROOT)} imports {name}"


def test_only_serving_deploy_imports_ray():
    for package in OURS:
        for path in _sources(package):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("serving/deploy/"):
                continue
            tops = {n.split(".")[0] for n in _imports(path)}
            assert "ray" not in tops, f"{rel} imports ray"


def test_files_stay_small():
    for package in (*OURS, "tests", "bench"):
        for path in _sources(package):
            lines = len(path.read_text().splitlines())
            assert lines <= 350, f"{path.relative_to(ROOT)} has {lines} lines"
