"""The installed `loraserve` console script."""

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest


def _run(*args):
    # The script pip installed beside this interpreter, whether or not its venv is activated.
    beside = Path(sys.executable).parent / "loraserve"
    exe = str(beside) if beside.exists() else shutil.which("loraserve")
    if exe is None:
        pytest.fail("the loraserve console script is not installed (pip install -e .)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_version():
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loraserve {version('loraserve')}"


def test_help():
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: loraserve" in done.stdout
    assert "--version" in done.stdout


def test_unknown_option_fails_cleanly():
    done = _run("--no-such-option")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "No such option" in done.stderr


def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "serving", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loraserve ")
