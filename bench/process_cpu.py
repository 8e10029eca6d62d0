"""CPU time of a server's whole process tree over a run, by the role each process plays.

A process's CPU is its user + system seconds (psutil), summed over the server's process and
all its descendants: for `loraserve serve` the driver, Ray's GCS and raylet, and the actors'
workers raylet starts; for vLLM the API server, its engine core and model worker. A sampler thread re-reads
the tree every SAMPLE_S while the run lasts, so a process that starts in between counts from
zero, and one that ends counts up to its last sample (at most SAMPLE_S of its time is missed;
`ended` says how many did). Processes are told apart by (pid, start time), so a reused pid is
a new process. A role is read from the process's command line, which Ray's workers and vLLM's
engine core overwrite with a title (`ray::ServeReplica:loraserve:ModelServer`,
`VLLM::EngineCore`); the server's own process has its kind's root role.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

SAMPLE_S = 0.5

# The engine's grammar compile processes (serving/engine/grammar/process.py), idle unless a
# request asks for structured output.
REPLICA = "ModelServer replica"
GRAMMAR = ("grammar compile processes", r"-m serving\.engine\.grammar\.process\b")
# Per server kind: the root process's role, then (role, pattern on the command line) in order,
# the first match winning; a process that matches none is "other".
ROLES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "loraserve": (
        "driver",
        (
            (REPLICA, r"^ray::ServeReplica:[^:\s]+:ModelServer\b"),
            ("Serve proxy", r"^ray::ProxyActor\b"),
            ("Serve controller", r"^ray::ServeController\b"),
            ("other Ray workers", r"^ray::"),  # Tenancy, Batch, idle workers
            ("raylet", r"^\S*/raylet(\s|$)"),
            ("GCS", r"^\S*/gcs_server(\s|$)"),
            ("Ray daemons", r"/ray/(dashboard|autoscaler|_private)/\S+\.py\b"),  # logs, monitor
            GRAMMAR,
        ),
    ),
    "vllm": (
        "API server",
        (("engine core", r"^VLLM::EngineCore\b"), ("model worker", r"^VLLM::Worker\b")),
    ),
    "local": ("server process", (GRAMMAR,)),
}
# Per loraserve kind, the role of the process that holds the model and runs its steps.
MODEL_ROLE = {"loraserve": REPLICA, "local": ROLES["local"][0]}
# The column order of the tables: every kind's roles, the roots' among them.
ROLE_ORDER = (
    REPLICA, "Serve proxy", "Serve controller", "other Ray workers", "raylet",
    "GCS", "Ray daemons", "driver", "API server", "engine core", "model worker", "server process",
    GRAMMAR[0], "other",
)  # fmt: skip


def role_of(cmdline: str, is_root: bool, kind: str) -> str:
    """The role of a process with this command line (arguments joined by spaces) in a tree."""
    root, rules = ROLES[kind]
    if is_root:
        return root
    return next((role for role, pattern in rules if re.search(pattern, cmdline)), "other")


class Seen(NamedTuple):
    """One process at one moment."""

    role: str
    seconds: float  # CPU so far
    cmdline: str


@dataclass
class TreeCpu:
    """CPU seconds a process tree spent over a run, by role."""

    seconds: dict[str, float]
    processes: int  # seen over the run
    started: int  # of those, started during it
    ended: int  # of those, gone before its end
    each: list[tuple[float, Seen]] = field(
        default_factory=list
    )  # (spent, last seen), busiest first

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


Key = tuple[int, float]  # (pid, start time)


def snapshot(root: int, kind: str) -> dict[Key, Seen]:
    """{(pid, start time): Seen} of root and its descendants now."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
                cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone meanwhile, or a zombie
            continue
        role = role_of(cmdline, proc.pid == root, kind)
        out[key] = Seen(role, times.user + times.system, cmdline)
    return out


def tree_cpu(first: dict[Key, Seen], last: dict[Key, Seen], seen: dict[Key, Seen]) -> TreeCpu:
    """The CPU spent between snapshot `first` and snapshot `last`; `seen` holds every
    process's latest sample in between (those gone by `last` count up to it)."""
    seconds: dict[str, float] = {}
    each = []
    for key, now in {**seen, **last}.items():
        spent = now.seconds - (first[key].seconds if key in first else 0.0)
        seconds[now.role] = seconds.get(now.role, 0.0) + spent
        each.append((spent, now))
    every = first.keys() | seen.keys() | last.keys()
    each.sort(key=lambda e: -e[0])
    return TreeCpu(seconds, len(every), len(every - first.keys()), len(every - last.keys()), each)


@dataclass
class TreeSampler:
    """Samples a process tree's CPU on a thread between start() and stop()."""

    root: int
    kind: str
    own_seconds: float = 0.0  # this sampler's own CPU, spent in the calling process
    _first: dict = field(default_factory=dict)
    _seen: dict = field(default_factory=dict)

    def start(self) -> None:
        self._stop = threading.Event()
        self._first = snapshot(self.root, self.kind)
        self._seen = dict(self._first)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.wait(SAMPLE_S):
            self._seen.update(snapshot(self.root, self.kind))
        self.own_seconds = time.thread_time() - t0

    def stop(self) -> TreeCpu:
        last = snapshot(self.root, self.kind)
        self._stop.set()
        self._thread.join()
        return tree_cpu(self._first, last, self._seen)


def pids_by_role(root: int, kind: str) -> dict[str, list[int]]:
    """{role: [pid, ...]} of root's tree now."""
    out: dict[str, list[int]] = {}
    for (pid, _), seen in snapshot(root, kind).items():
        out.setdefault(seen.role, []).append(pid)
    return out


def thread_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """{thread id: (name, CPU seconds so far)} of one process's live threads.

    Names as the kernel keeps them (15 characters): Python's threads bear the process's name,
    unless the code names them (Ray's core worker threads do).
    """
    out: dict[int, tuple[str, float]] = {}
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return out
    for t in threads:
        try:
            with open(f"/proc/{pid}/task/{t.id}/comm") as f:
                name = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        out[t.id] = (name, t.user_time + t.system_time)
    return out


def settle(root: int, kind: str, below: float = 0.1, window: float = 1.0,
           timeout: float = 60.0) -> tuple[float, float]:  # fmt: skip
    """Wait until the tree spends under `below` cores over a window, so that what it starts in
    the background has started; the seconds waited (`timeout` at most) and the last window's
    cores."""
    t0 = time.perf_counter()
    last = snapshot(root, kind)
    while True:
        time.sleep(window)
        now = snapshot(root, kind)
        cores = tree_cpu(last, now, {}).total / window
        if cores < below or time.perf_counter() - t0 >= timeout:
            return time.perf_counter() - t0, cores
        last = now
