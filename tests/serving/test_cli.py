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


def test_serve_help_names_the_listen_defaults():
    done = _run("serve", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.replace("│", " ").split())  # the help box, its lines joined
    assert "default: the config's server.host (127.0.0.1)" in text
    assert "default: the config's server.port (8000)" in text


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


@pytest.mark.parametrize(
    ("args", "host", "insecure"),
    [((), "127.0.0.1", False), (("--host", "0.0.0.0", "--insecure"), "0.0.0.0", True)],
)
def test_serve_options_become_the_config_the_app_checks(
    tmp_path, monkeypatch, args, host, insecure
):
    """--host and --insecure reach the app's own open-server check, wherever it runs."""
    from typer.testing import CliRunner

    from serving import cli
    from serving.deploy import launch

    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    started = []
    monkeypatch.setattr(launch, "serve_until_stopped", lambda cfg, echo: started.append(cfg))
    config = tmp_path / "c.yaml"
    config.write_text("model: {id: x}\n")
    done = CliRunner().invoke(cli.app, ["serve", "--config", str(config), "--port", "8123", *args])
    assert done.exit_code == 0, done.output
    (cfg,) = started
    assert (cfg.server.host, cfg.server.port, cfg.server.insecure) == (host, 8123, insecure)


def test_serve_refuses_a_short_key_in_one_line_naming_its_tenant(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from serving import cli
    from serving.deploy import launch

    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    started = []
    monkeypatch.setattr(launch, "serve_until_stopped", lambda cfg, echo: started.append(cfg))
    keys = tmp_path / "keys"
    keys.write_text("sk-0123456789 acme user\n")
    keys.chmod(0o600)
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{id: x}}\nserver: {{api_keys_file: {keys}}}\n")
    done = CliRunner().invoke(cli.app, ["serve", "--config", str(config)])
    assert done.exit_code == 1 and started == []
    (line,) = done.output.splitlines()
    assert line.startswith(f"error: {keys}, line 1: the key of tenant 'acme' is shorter than 16")
    assert "sk-0123456789" not in line.replace(str(keys), "")
