"""py-spy on a server's busy processes while a load runs, for bench/serve.py's stage table.

    python -m bench.serve --profile ...             # profiles a run beside the timed ones
    python -m bench.serve_profile DIR [--verbose]    # the table again from the files it kept

py-spy (it comes with ray[serve]) samples each profiled process from outside, without pausing
it (--nonblocking), RATE times a second, every Python thread with its OS thread id; a thread
that waits (in a lock, a select, a sleep) is idle and left out. The kernel's CPU time of each
thread and of the process is read before and after; bench/serve_stages.py splits it by stage.
Each process's samples go to LABEL-PID.txt (py-spy's raw format) beside LABEL-PID.json (the
label, the run's output tokens, the rate and the CPU times), so the table can be made again,
with other rules, without running the servers.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.process_cpu import pids_by_role, thread_seconds
from bench.serve_stages import Profile, details, parse_raw, table

RATE = 250  # samples a second, per thread

# The processes of a server kind that do its work per token (bench/process_cpu.py's roles).
PROFILED = {
    "loraserve": ("ModelServer replica", "Serve proxy"),
    "vllm": ("API server", "engine core", "model worker"),
    "local": ("server process",),
}


def targets(name: str, root: int, kind: str) -> dict[str, int]:
    """{"server: role": pid} of the processes to sample in root's tree, numbered if several."""
    by_role = pids_by_role(root, kind)
    out = {}
    for role in PROFILED[kind]:
        pids = sorted(by_role.get(role, ()))
        for i, pid in enumerate(pids, 1):
            out[f"{name}: {role}" + (f" {i}" if len(pids) > 1 else "")] = pid
    return out


def py_spy() -> str:
    """The py-spy beside this Python, else the one on PATH; a clear error if none."""
    here = Path(sys.executable).with_name("py-spy")
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy not found: it comes with ray[serve] (pip install py-spy)")
    return found


class Spy:
    """`py-spy record` on one process, from start() until stop() (SIGINT, as Ctrl-C)."""

    def __init__(self, pid: int, out: Path, rate: int = RATE, native: bool = False):
        self.pid, self.out, self.rate, self.native = pid, out, rate, native
        self.log = out.with_suffix(".log")

    def start(self) -> None:
        # Native frames (C, C++, Cython) need the process paused for each sample.
        how = ["--native"] if self.native else ["--nonblocking"]
        cmd = [py_spy(), "record", "--pid", str(self.pid), "--format", "raw", "--rate",
               str(self.rate), *how, "--threads", "--full-filenames", "--nolineno",
               "-o", str(self.out)]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip

    def stop(self) -> int:
        """Stop sampling; how many samples py-spy could not read."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        log = self.log.read_text(errors="replace")
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing for pid {self.pid}:\n{log[-1000:]}")
        errors = re.search(r"Errors: (\d+)", log)
        return int(errors[1]) if errors else 0


def file_name(label: str) -> str:
    """A label as a file name: "vllm: engine core" -> "vllm-engine-core"."""
    return re.sub(r"\W+", "-", label).strip("-")


def profile_run(targets: dict[str, int], run: Callable[[], int], out_dir: Path,
                rate: int = RATE, native: bool = False) -> list[Profile]:  # fmt: skip
    """Sample each of targets ({label: pid}) while run() runs; run returns its output tokens."""
    import psutil

    procs = {label: psutil.Process(pid) for label, pid in targets.items()}
    spies = {label: Spy(pid, out_dir / f"{file_name(label)}-{pid}.txt", rate, native)
             for label, pid in targets.items()}  # fmt: skip
    threads = {label: thread_seconds(pid) for label, pid in targets.items()}
    cpu = {label: sum(p.cpu_times()[:2]) for label, p in procs.items()}
    for spy in spies.values():
        spy.start()
    time.sleep(1.0)  # py-spy attaches; idle samples meanwhile are left out anyway
    try:
        tokens = run()
    finally:
        errors = {label: spy.stop() for label, spy in spies.items()}
    profiles = []
    for label, pid in targets.items():
        before = threads[label]
        spent = {tid: (name, s - before.get(tid, (name, 0.0))[1])
                 for tid, (name, s) in thread_seconds(pid).items()}  # fmt: skip
        meta = {"label": label, "tokens": tokens, "rate": rate, "errors": errors[label],
                "cpu_seconds": sum(procs[label].cpu_times()[:2]) - cpu[label],
                "threads": {str(tid): list(v) for tid, v in spent.items()}}  # fmt: skip
        spies[label].out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
        profiles.append(load(spies[label].out))
    return profiles


def load(raw: Path) -> Profile:
    """The profile of raw (py-spy's file) with the figures in the .json beside it."""
    meta = json.loads(raw.with_suffix(".json").read_text())
    threads = {int(tid): (name, s) for tid, (name, s) in meta["threads"].items()}
    return Profile(meta["label"], parse_raw(raw.read_text()), meta["tokens"], meta["rate"],
                   threads, meta["cpu_seconds"], meta["errors"])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="raw files, or folders of profiles")
    ap.add_argument("--verbose", action="store_true", help="the leaf frames left in other")
    args = ap.parse_args(argv)
    raws = [r for p in args.paths
            for r in ([j.with_suffix(".txt") for j in sorted(p.glob("*.json"))]
                      if p.is_dir() else [p])]  # fmt: skip
    profiles = []
    for raw in raws:
        try:
            profiles.append(load(raw))
        except (OSError, ValueError, KeyError) as exc:
            ap.error(f"{raw}: {type(exc).__name__}: {exc} (wants py-spy's raw file and its .json)")
    if not profiles:
        ap.error(
            "no profiles (py-spy's LABEL-PID.txt beside LABEL-PID.json) in "
            + ", ".join(map(str, args.paths))
        )
    print("\n".join(table(profiles)))
    if args.verbose:
        for p in profiles:
            print("\n" + "\n".join(details(p)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
