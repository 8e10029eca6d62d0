"""`loraserve serve` on the demo config, stopped by Ctrl-C: the terminal shows our lines only.

Ray's own output (its notices, the lines forwarded from the raylet and the Serve actors)
goes to the log file the CLI names. The server runs in a session of its own and gets SIGINT
on its whole process group, as a terminal's Ctrl-C sends it; whatever it leaves behind is
killed by that group, never by `ray stop`, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
STOP_TIMEOUT_S = 120


def _demo_config(tmp: Path, port: int) -> Path:
    """configs/demo.yaml with its kit read from the repository and its state kept in tmp."""
    config = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    for section in ("model", "draft"):
        config[section]["path"] = str(ROOT / config[section]["path"])
    lora = config["lora"]
    lora["preload"] = {name: str(ROOT / path) for name, path in lora["preload"].items()}
    lora["registry"] = f"file://{tmp / 'registry'}"
    config["batch"]["store"] = f"sqlite:///{tmp / 'batch.db'}"
    config["usage"]["store"] = f"sqlite:///{tmp / 'usage.db'}"
    config["server"]["port"] = port
    path = tmp / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_ctrl_c_leaves_only_our_lines_on_the_terminal(tmp_path):
    port = free_port()
    config = _demo_config(tmp_path, port)
    # Short, as Ray's socket paths under it must fit 107 bytes; the CLI puts Ray's temp dir
    # under XDG_CACHE_HOME.
    cache = tempfile.mkdtemp(prefix="lsc-")
    env = {k: v for k, v in os.environ.items() if k not in ("LORASERVE_API_KEYS", "RAY_ADDRESS")}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=cache)
    env.pop("XDG_STATE_HOME", None)  # so the log goes under this test's HOME
    terminal = tmp_path / "terminal.txt"
    with open(terminal, "w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "loraserve"), "serve", "--config", str(config)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever it started and left behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(cache, ignore_errors=True)
    lines = terminal.read_text().splitlines()
    assert proc.returncode == 0, lines
    log_line = next((line for line in lines if line.startswith("loraserve: Ray logs in ")), "")
    log = Path(log_line.removeprefix("loraserve: Ray logs in "))
    expected = [
        "loraserve: starting demo (1 replica(s))",
        f"loraserve: Ray logs in {log}",
        f"loraserve: serving demo on http://127.0.0.1:{port} (OpenAI API at /v1)",
        "loraserve: stopping: finishing requests in flight",
        "loraserve: stopped",
    ]
    assert lines == expected, log.read_text() if log.is_file() else "no log file"
    assert log.is_relative_to(tmp_path / "home") and re.fullmatch(r"serve-[\d-]+\.log", log.name)
    ray_lines = log.read_text()
    assert "Started a local Ray instance" in ray_lines, ray_lines
    assert "\x1b[" not in ray_lines  # forwarded lines without colour codes
