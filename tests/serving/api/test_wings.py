"""serving.api is one core with protocol wings: the core (serving.api.core) holds the one path
from a request to its generation, each wing (OpenAI, Workers AI, batch, admin, edge) imports
the core and never another wing, and the core imports no wing. Only serving/api/app.py, the
composition root, imports them all."""

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[3] / "serving" / "api"
CORE = "core"
WINGS = ("openai", "workers_ai", "batch", "admin", "edge")


def api_parts(path: Path) -> set[str]:
    """The parts of serving.api a module imports (the package itself as "serving.api")."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "serving.api":  # from serving.api import openai
                modules = [f"serving.api.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: from .. import x, from ..x import y
            package = path.relative_to(API.parent.parent).parent.parts[: -node.level + 1 or None]
            base = ".".join(package)
            module = f"{base}.{node.module}" if node.module else base
            modules = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for module in modules:
            names = module.split(".")
            if names[:2] == ["serving", "api"]:
                parts.add(names[2] if len(names) > 2 else "serving.api")
    return parts


def test_the_api_is_the_core_the_wings_and_the_app():
    packages = {p.parent.name for p in API.glob("*/__init__.py")}
    assert packages == {CORE, *WINGS}
    assert {p.name for p in API.glob("*.py")} == {"__init__.py", "app.py"}


@pytest.mark.parametrize("part", [CORE, *WINGS])
def test_a_wing_imports_only_the_core_and_the_core_no_wing(part):
    allowed = {CORE, part}
    for path in sorted((API / part).rglob("*.py")):
        for imported in api_parts(path) - allowed:
            pytest.fail(f"{path.relative_to(API.parent.parent)} imports serving.api's {imported}")
