"""A Ray head node of a test's own: `ray start --head` in a temp dir, on free ports, stopped by
its process group (never `ray stop`, which would stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.serving.deploy.served import free_port

BIN = Path(sys.executable).parent
PORT_FLAGS = ("--port", "--node-manager-port", "--object-manager-port", "--ray-client-server-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--metrics-export-port", "--runtime-env-agent-port")  # fmt: skip
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class Head:
    address: str  # the GCS address, host:port
    dashboard: str | None  # the dashboard's URL, when started with one


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without API keys (as on a remote node), HOME at home
    (made, as a user's home exists)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "LORASERVE_API_KEYS"}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), **extra}


def stop(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """sig to proc, then SIGKILL to its process group (its own session) after timeout."""
    if proc.poll() is None:
        proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):  # whatever it started and left behind
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_for_dashboard(url: str, head: subprocess.Popen, log: Path, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/ray/version", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:  # refused or reset while it starts
            pass
        assert head.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no dashboard at {url}: " + log.read_text()
        time.sleep(0.5)


@contextlib.contextmanager
def ray_head(root: Path, *, dashboard: bool = False, **env: str) -> Iterator[Head]:
    """A fresh 2-CPU head node, with no Serve running yet: whoever joins it starts Serve."""
    ray_dir = tempfile.mkdtemp(prefix="lsrc-")  # short: Ray's socket paths must fit 107 bytes
    ports = {flag: free_port() for flag in PORT_FLAGS}
    flags = [f"{flag}={port}" for flag, port in ports.items()]
    if dashboard:
        ports["--dashboard-port"] = free_port()
        flags += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                  f"--dashboard-port={ports['--dashboard-port']}"]  # fmt: skip
    else:
        flags.append("--include-dashboard=false")
    command = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2",
               "--disable-usage-stats", f"--temp-dir={ray_dir}", *flags]  # fmt: skip
    log = root / "ray.log"
    # No drain on SIGTERM: the node has nothing to hand over.
    environ = env_for(root / "home", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", **env)
    with open(log, "w") as out:
        head = subprocess.Popen(
            command, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        url = f"http://127.0.0.1:{ports['--dashboard-port']}" if dashboard else None
        if url is not None:  # the dashboard comes up after the runtime, later on a busy host
            _wait_for_dashboard(url, head, log, deadline)
        yield Head(f"127.0.0.1:{ports['--port']}", url)
    finally:
        stop(head, signal.SIGTERM, timeout=30)
        shutil.rmtree(ray_dir, ignore_errors=True)
