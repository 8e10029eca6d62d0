"""The docs say what the code does: docs/config.md is the config models' rendering, every
environment variable the code reads is in it, README's routes table lists the routes the app
serves, and the README's links lead to files and headings that exist."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from adapters.registry.registry import Registry
from serving.api import AppSettings, create_app
from serving.config.reference import ENVIRONMENT, REGENERATE, render

ROOT = Path(__file__).resolve().parents[1]
# os.environ.get("NAME") / env.get("NAME"), and every LORASERVE_ name, however it is read.
ENV_READ = re.compile(r"""environ\.get\(\s*["']([A-Z_][A-Z0-9_]*)["']|\b(LORASERVE_[A-Z0-9_]+)""")
ROUTE_ROW = re.compile(r"^\| ([A-Z, ]+) \| `(/[^`]*)` \|", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_config_reference_is_current():
    written = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert written == render(), f"docs/config.md is stale; regenerate it: {REGENERATE}"


def test_config_reference_names_every_key():
    text = render()
    for key in ("slab_mb", "host_mb", "max_num_seqs", "api_keys_file", "batch_file_mb"):
        assert re.search(rf"^\| `{key}` \| .+ \| `.*` \| \S", text, re.M), key
    assert "| `max_speculative_tokens`" not in text  # no key the models lack


def _environment_read() -> dict[str, str]:
    """Every environment variable named in the server's, kernels' and adapters' code -> where."""
    found = {}
    for package in ("serving", "kernels", "adapters"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for match in ENV_READ.finditer(path.read_text(encoding="utf-8")):
                found.setdefault(match[1] or match[2], str(path.relative_to(ROOT)))
    return found


def test_every_environment_variable_read_is_documented():
    read = _environment_read()
    documented = {name for name, _ in ENVIRONMENT}
    assert "LORASERVE_LORA_CONFIGS" in read and "LORASERVE_API_KEYS" in read  # the scan works
    missing = {name: where for name, where in read.items() if name not in documented}
    assert not missing, f"add these to ENVIRONMENT in serving/config/reference.py: {missing}"


def test_the_environment_scan_finds_a_new_variable():
    sample = 'flag = os.environ.get("LORASERVE_NEW_SWITCH", "0")\nhome = os.environ.get("HOME")'
    assert {m[1] or m[2] for m in ENV_READ.finditer(sample)} == {"LORASERVE_NEW_SWITCH", "HOME"}


def _walk(routes, prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route, included routers opened; path converters dropped."""
    found = set()
    for route in routes:
        if hasattr(route, "methods") and hasattr(route, "path"):
            path = re.sub(r":\w+}", "}", prefix + route.path)  # {model:path} -> {model}
            found |= {(method, path) for method in route.methods}
        elif hasattr(route, "original_router"):  # FastAPI's router included as it is
            found |= _walk(route.original_router.routes, prefix + route.include_context.prefix)
        else:  # a Mount
            found |= _walk(getattr(route, "routes", []), prefix + getattr(route, "path", ""))
    return found


def _served(tmp_path: Path) -> set[tuple[str, str]]:
    """The routes of the app as `loraserve serve` builds it (no model is needed to list them)."""
    settings = AppSettings(model_id="demo", max_model_len=64, tokenizer=None,
                           registry=Registry(str(tmp_path / "reg")), base_spec=None)  # fmt: skip
    app = create_app(None, settings)
    served = _walk(app.routes)
    with warnings.catch_warnings():  # HEAD beside GET repeats an operation id; harmless here
        warnings.simplefilter("ignore")
        described = {
            (method.upper(), path)
            for path, operations in app.openapi()["paths"].items()
            for method in operations
        }
    assert described <= served, f"routes the walk missed: {described - served}"
    return served


# Cloudflare's prefixes: the Workers-AI wing's copies under them are one README row each
CLOUDFLARE_COPY = re.compile(
    r"^(?:/client/v4/accounts/\{account_id\}|/accounts/\{account_id\})(?=/ai/)|^/client/v4(?=/)"
)
ACCOUNT_COPIES = ("/accounts/{account_id}", "/client/v4/accounts/{account_id}")


def _folded(served: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """served with each route that Cloudflare's prefixes repeat listed once, after checking
    that every /ai route answers under both account prefixes."""
    folded = {(method, CLOUDFLARE_COPY.sub("", path)) for method, path in served}
    for method, path in folded:
        if path.startswith("/ai/"):
            missing = [p + path for p in ACCOUNT_COPIES if (method, p + path) not in served]
            assert not missing, f"{method} {path} is not served under {missing}"
    return folded


def _readme_routes(text: str) -> set[tuple[str, str]]:
    section = text.split("\n## Routes\n", 1)[1].split("\n## ", 1)[0]
    return {
        (method.strip(), path)
        for methods, path in ROUTE_ROW.findall(section)
        for method in methods.split(",")
    }


def test_readme_routes_table_is_the_apps_routes(tmp_path):
    listed = _readme_routes((ROOT / "README.md").read_text(encoding="utf-8"))
    served = _folded(_served(tmp_path))
    assert not served - listed, f"add to README's Routes table: {sorted(served - listed)}"
    assert not listed - served, (
        f"README's Routes table lists what is not served: {sorted(listed - served)}"
    )


def test_the_routes_table_reader_sees_a_row_go():
    text = "\n## Routes\n\n| method | path |\n| --- | --- |\n| GET, HEAD | `/healthz` | x |\n"
    assert _readme_routes(text) == {("GET", "/healthz"), ("HEAD", "/healthz")}
    assert _readme_routes(text.replace("| GET, HEAD |", "| GET |")) == {("GET", "/healthz")}


def _anchors(text: str) -> set[str]:
    """The fragments a Markdown viewer gives the headings of text (GitHub's rule)."""
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_links_lead_somewhere(page):
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    text = path.read_text(encoding="utf-8")
    for link in LINK.findall(text):
        if re.match(r"[a-z]+://", link):
            continue
        target, _, fragment = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{page}: {link} leads to no file"
        if fragment and file.suffix == ".md":
            assert fragment in _anchors(file.read_text(encoding="utf-8")), f"{page}: {link}"


# serving/api/core/caller.py, `adapters/slab/`, kernels/lora_ops.py:lora_shrink: a path of this
# tree, in prose, backticks or a drawing (the path ends where a wildcard or placeholder starts).
TREE_PATH = re.compile(
    r"(?<![\w./-])((?:kernels|adapters|serving|bench|tests|configs|models|helm|docs)/[\w./-]*)"
)
PAGES = [
    "README.md",
    "bench/README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]


def _tree_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in TREE_PATH.findall(text)}


@pytest.mark.parametrize("page", PAGES)
def test_paths_named_in_the_docs_exist(page):
    missing = [p for p in _tree_paths((ROOT / page).read_text(encoding="utf-8"))
               if not (ROOT / p).exists()]  # fmt: skip
    assert not missing, f"{page} names paths that are gone: {sorted(missing)}"


def test_the_path_reader_sees_a_moved_file():
    assert _tree_paths("in `serving/api/core/caller.py`, `adapters/slab/`.") == {
        "serving/api/core/caller.py", "adapters/slab/",
    }  # fmt: skip
    assert not (ROOT / "serving/api/auth.py").exists()  # the kind of path the test catches


def test_the_architecture_map_names_every_package():
    """docs/architecture.md is the living map: a package folder it does not name is a room
    added without its place on the map."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(
        p.parent.relative_to(ROOT).as_posix() + "/"
        for top in ("kernels", "adapters", "serving")
        for p in (ROOT / top).rglob("__init__.py")
    )
    assert [p for p in packages if f"`{p}" not in text] == []
