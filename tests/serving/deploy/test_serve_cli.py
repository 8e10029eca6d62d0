"""`loraserve serve` refuses what it cannot serve safely: one line, exit 1, before Ray starts."""

import os
import subprocess
import sys
from pathlib import Path


def _serve_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LORASERVE_API_KEYS"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    exe = Path(sys.executable).parent / "loraserve"
    return subprocess.run(
        [str(exe), "serve", *args], capture_output=True, text=True, timeout=120, env=env,
        cwd=tmp_path,
    )  # fmt: skip


def test_serve_refuses_a_public_host_without_keys(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {id: x}\n")
    done = _serve_cli(tmp_path, "--config", str(config), "--host", "0.0.0.0")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "0.0.0.0" in lines[0] and "--insecure" in lines[0]
    assert not (tmp_path / "cache" / "loraserve").exists()  # no Ray temp dir: Ray never started


def test_serve_bad_config_is_one_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model: {id: x}\nscheduler: {max_num_seqs: 0}\nnot_a_section: 1\n")
    done = _serve_cli(tmp_path, "--config", str(config))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {config}"), done.stderr
    assert "scheduler.max_num_seqs" in lines[0] and "not_a_section" in lines[0]
    missing = _serve_cli(tmp_path, "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and "no such config file" in missing.stderr
