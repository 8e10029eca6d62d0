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


# serving's parts, each with the parts of ours it may import (besides itself): deploy -> api
# -> engine -> model -> kernels, api -> batch and usage, and config imports nothing of ours,
# nor does private_sqlite (the stores' owner-only SQLite files, for batch and usage alike).
BELOW_MODEL = {"kernels", "adapters", "serving.config", "serving.private_sqlite"}
SERVING_ALLOWED = {
    "serving.config": set(),
    "serving.usage": {"serving.config", "serving.private_sqlite"},
    "serving.batch": BELOW_MODEL,
    "serving.model": BELOW_MODEL,
    "serving.engine": BELOW_MODEL | {"serving.model"},
    "serving.api": BELOW_MODEL
    | {"serving.model", "serving.engine", "serving.batch", "serving.usage"},
    "serving.deploy": BELOW_MODEL
    | {"serving.model", "serving.engine", "serving.batch", "serving.usage", "serving.api"},
}


def _part(name: str) -> str:
    """serving.api.app -> serving.api; adapters.slab.slab -> adapters."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "serving" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("part", sorted(SERVING_ALLOWED))
def test_serving_parts_import_only_downward(part):
    for path in sorted((ROOT / part.replace(".", "/")).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in OURS and _part(name) != part:
                assert _part(name) in SERVING_ALLOWED[part], (
                    f"{path.relative_to(ROOT)} imports {name}"
                )


# adapters' folders, each with the folders of adapters it may import (besides itself): the
# format is read by all, the registry stores formats, the slab loads registry versions (by
# their digests), the CLI drives the registry; adapters.errors is everyone's.
ADAPTERS_ALLOWED = {
    "adapters.format": {"adapters.errors"},
    "adapters.registry": {"adapters.errors", "adapters.format"},
    "adapters.slab": {"adapters.errors", "adapters.format", "adapters.registry"},
    "adapters.cli": {"adapters.errors", "adapters.format", "adapters.registry"},
}


@pytest.mark.parametrize("part", sorted(ADAPTERS_ALLOWED))
def test_adapters_folders_import_only_downward(part):
    for path in sorted((ROOT / part.replace(".", "/")).rglob("*.py")):
        for name in _imports(path):
            other = ".".join(name.split(".")[:2])
            if name.startswith("adapters.") and other != part:
                assert other in ADAPTERS_ALLOWED[part], f"{path.relative_to(ROOT)} imports {name}"


def test_every_adapters_folder_has_its_rule():
    folders = {f"adapters.{p.parent.name}" for p in (ROOT / "adapters").glob("*/__init__.py")}
    assert folders == ADAPTERS_ALLOWED.keys()


def test_no_module_imports_itself_back_at_import_time():
    """No cycle among our modules' top-level imports (imports inside functions are lazy)."""
    modules = {}
    for package in sorted(OURS):
        for path in _sources(package):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _top_level_imports(path, modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            pytest.fail("import cycle: " + " -> ".join([*trail[trail.index(name) :], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def _top_level_imports(path: Path, modules: dict) -> set[str]:
    """The modules of ours that importing path imports, at its top level (`from pkg import
    mod` counts as mod)."""
    found = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found |= subs if len(subs) == len(node.names) else {*subs, node.module}
    return found


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
