"""The docs say what the code does: docs/config.md is the config models' rendering, every
environment variable the code reads is in it, README's routes table lists the routes the app
serves, and the README's links lead to files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

from serving.config.reference import ENVIRONMENT, REGENERATE, render

ROOT = Path(__file__).resolve().parents[1]
# os.environ.get("NAME") / env.get("NAME"), and every LORASERVE_ name, however it is read.
ENV_READ = re.compile(r"""environ\.get\(\s*["']([A-Z_][A-Z0-9_]*)["']|\b(LORASERVE_[A-Z0-9_]+)""")


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
