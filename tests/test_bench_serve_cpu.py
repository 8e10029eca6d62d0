"""bench/serve.py's CPU accounting without servers: the roles of a server's processes, the CPU
of a real process tree whose processes start and end during the run, and the CPU table."""

import os
import signal
import subprocess
import sys
import time

import pytest

from bench.load import Record
from bench.process_cpu import ROLES, TreeCpu, TreeSampler, role_of, tree_cpu

SITE = "/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("cmdline", "kind", "role"),
    [
        ("ray::ServeReplica:loraserve:ModelServer", "loraserve", "ModelServer replica"),
        ("ray::ServeReplica:loraserve:Tenancy", "loraserve", "other Ray workers"),
        ("ray::ProxyActor", "loraserve", "Serve proxy"),
        ("ray::ServeController.listen_for_change", "loraserve", "Serve controller"),
        (f"{SITE}/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/x", "loraserve",
         "raylet"),
        (f"{SITE}/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x", "loraserve", "GCS"),
        (f"/venv/bin/python -u {SITE}/ray/_private/log_monitor.py --x", "loraserve",
         "Ray daemons"),
        ("/venv/bin/python -m serving.engine.grammar.process", "local",
         "grammar compile processes"),
        ("VLLM::EngineCore", "vllm", "engine core"),
        ("VLLM::Worker", "vllm", "model worker"),
        ("/venv/bin/python -B -c from multiprocessing.resource_tracker import main", "vllm",
         "other"),
    ],
)  # fmt: skip
def test_a_process_role_is_read_from_its_title(cmdline, kind, role):
    assert role_of(cmdline, False, kind) == role
    assert role_of(cmdline, True, kind) == ROLES[kind][0]  # the server's own process


def test_a_reused_pid_is_another_process():
    first = {(7, 1.0): _seen(5.0), (8, 1.0): _seen(1.0)}
    seen = {(7, 1.0): _seen(6.0), (8, 1.0): _seen(1.5), (8, 9.0): _seen(0.25)}
    last = {(7, 1.0): _seen(7.0), (8, 9.0): _seen(0.5)}
    cpu = tree_cpu(first, last, seen)
    # pid 8's first process ended at 1.5 (0.5 spent); the second started from zero
    assert cpu.seconds == {"w": pytest.approx(2.0 + 0.5 + 0.5)}
    assert (cpu.processes, cpu.started, cpu.ended) == (3, 1, 1)


def _seen(seconds: float):
    from bench.process_cpu import Seen

    return Seen("w", seconds, "w")


CHILD = """
import os, sys, time
go, out, burn, linger = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.01)
t0 = time.process_time()
while time.process_time() - t0 < burn:
    pass
open(out, "w").write(str(time.process_time() - t0))
time.sleep(linger)
"""
ROOT = """
import os, subprocess, sys, time
child, go, tmp = sys.argv[1:4]
run = lambda name, burn, linger: subprocess.Popen(
    [sys.executable, "-c", child, go, os.path.join(tmp, name), burn, linger, "burn"])
run("a", "0.3", "60")
while not os.path.exists(go):
    time.sleep(0.01)
time.sleep(0.3)
run("b", "0.2", "1.0").wait()
time.sleep(60)
"""


def test_the_tree_counts_processes_that_start_and_end_during_the_run(tmp_path, monkeypatch):
    # A root with a child burning 0.3 s of CPU, and a second child that starts after the
    # first sample, burns 0.2 s and ends: the tree's CPU is what the children count themselves.
    monkeypatch.setitem(ROLES, "fake", ("root", (("burner", r"\bburn$"),)))
    go = tmp_path / "go"
    root = subprocess.Popen([sys.executable, "-c", ROOT, CHILD, str(go), str(tmp_path)],
                            start_new_session=True)  # fmt: skip
    try:
        _wait_for(lambda: len(_children(root.pid)) == 1)
        sampler = TreeSampler(root.pid, "fake")
        sampler.start()
        go.touch()
        _wait_for(lambda: (tmp_path / "b").exists() and len(_children(root.pid)) == 1)
        cpu: TreeCpu = sampler.stop()
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    burnt = float((tmp_path / "a").read_text()) + float((tmp_path / "b").read_text())
    assert cpu.seconds["burner"] == pytest.approx(burnt, abs=0.08)  # 10 ms ticks, polling
    assert (cpu.processes, cpu.started, cpu.ended) == (3, 1, 1)
    assert 0.0 <= cpu.seconds["root"] < 0.2


def _children(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children()


def _wait_for(done, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_the_cpu_table_gives_seconds_per_thousand_tokens_by_role():
    from bench.serve_tables import Level, cpu_table

    records = [Record(0, tokens=600), Record(1, tokens=400), Record(2, error="HTTP 500")]
    cpu = TreeCpu({"ModelServer replica": 2.0, "raylet": 0.5}, processes=5, started=1, ended=0)
    lines = cpu_table({"loraserve": {4: Level(records, 1.0, cpu, 0.25)}}, [4])
    assert lines[0].endswith(
        "| ModelServer replica | raylet | client | processes (started, ended) |"
    )
    assert lines[2] == "| loraserve | 4 | 1000 | 2.50 | 2.00 | 0.50 | 0.25 | 5 (1, 0) |"


def test_the_checkout_row_needs_a_checkout():
    done = subprocess.run([sys.executable, "-m", "bench.serve", "--servers", "loraserve-checkout"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "needs --checkout PATH" in done.stderr
