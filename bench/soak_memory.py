"""Resident memory of a server over a soak (bench/soak.py): sampled each second, compared
between a baseline window and the last window, per request served between them.

Two figures per sample: the RSS summed over the server's process tree, and over the process
that runs the model (bench/process_cpu.py's MODEL_ROLE: the ModelServer replica, or the
one-process server, which is then its whole tree bar any grammar compile processes).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.process_cpu import MODEL_ROLE, pids_by_role

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class MemorySampler:
    """RSS of a server's process tree, and of its model's process apart, each second on a thread."""

    root: int
    kind: str  # bench/process_cpu.py's server kind: "loraserve" or "local"
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, tree, replica)
    processes: int = 0

    def start(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.origin = time.perf_counter()  # sample times are seconds from here
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            by_role = pids_by_role(self.root, self.kind)  # the rule bench/serve.py counts by
            pids = [pid for role_pids in by_role.values() for pid in role_pids]
            tree = sum(rss_bytes(p) for p in pids)
            replica = sum(rss_bytes(p) for p in by_role.get(MODEL_ROLE[self.kind], ()))
            self.samples.append((time.perf_counter() - self.origin, tree, replica))
            self.processes = len(pids)
            if self._stop.wait(1.0):
                return

    def means(self, start: float, end: float) -> dict[str, float]:
        """{"tree": bytes, "replica": bytes}: mean RSS over the samples from start to end."""
        inside = [s for s in self.samples if start <= s[0] <= end] or self.samples[-1:]
        return {what: sum(s[col] for s in inside) / len(inside)
                for what, col in (("tree", 1), ("replica", 2))}  # fmt: skip


@dataclass
class Growth:
    """Resident memory in the baseline and last windows, {"tree": bytes, "replica": bytes} each."""

    baseline: dict[str, float]
    last: dict[str, float]
    served: int  # requests that ended between the two windows' midpoints
    spans: str  # the two windows, in seconds from the load's start

    def ratio(self, what: str) -> float:
        return self.last[what] / self.baseline[what] - 1 if self.baseline[what] else 0.0

    def cell(self, what: str) -> str:
        """`baseline -> last (growth)`, in MiB."""
        a, b = self.baseline[what] / 2**20, self.last[what] / 2**20
        return f"{a:.0f} -> {b:.0f} ({self.ratio(what):+.1%})"

    def kb_per_request(self, what: str) -> str:
        """The change between the windows over the requests served between them, in KB."""
        delta = self.last[what] - self.baseline[what]
        return f"{delta / 1024 / self.served:+.1f}" if self.served else "-"


def growth(sampler: MemorySampler, ends: list[float], settle: float, window: float) -> Growth:
    """The baseline window from `settle` s and the last `window` s of the samples; `ends`:
    the perf_counter at which each request served ended."""
    end = sampler.samples[-1][0]
    first, last = (settle, settle + window), (end - window, end)
    served = sum(1 for t in ends if sum(first) / 2 <= t - sampler.origin <= sum(last) / 2)
    spans = f"{first[0]:.0f}-{first[1]:.0f} s / {last[0]:.0f}-{last[1]:.0f} s"
    return Growth(sampler.means(*first), sampler.means(*last), served, spans)
