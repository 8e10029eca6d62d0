"""Batch results survive SIGKILL wherever it lands: a job's feeder (crash_server.py, a process
of its own) is killed again and again, then run to the end; every item then has exactly the
result its body gives, counted once in the job, and no item ran again once its result was in.

After every death the store, read by a fresh connection, is checked whole: each result there
is the right one, the job's counts and token totals are exactly those of its results, and no
committed result went missing. The kill points are precise (right after a claim commits; in a
result's transaction, its UPDATEs done, before COMMIT; right after that COMMIT), and random.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from serving.batch.records import DONE, FAILED, QUEUED, RUNNING, WORKERS_AI, NewItem
from serving.batch.store import BatchStore
from tests.serving.batch.crash_served import KillableServer
from tests.serving.batch.crash_server import MAX_IN_FLIGHT, TENANT, result_for

ROOT = Path(__file__).resolve().parents[3]
TOTAL = 200
CHILD_TIMEOUT_S = 60


def body(i: int) -> dict:
    """Item i's body; every 25th fails, so failed results must survive crashes as well."""
    return {"prompt": f"item {i} of the batch", **({"fail": True} if i % 25 == 7 else {})}


@dataclass
class Crashes:
    """One job in a store file, the feeder processes run over it, and what each left."""

    root: Path
    job_id: str = ""
    committed: set[int] = field(default_factory=set)  # items with a result, as last seen
    runs_seen: int = 0  # lines of runs.log already checked
    ran: Counter = field(default_factory=Counter)  # runs of each item, over every process

    @property
    def db(self) -> Path:
        return self.root / "batch.db"

    def start(self, kill: str = "none", n: int = 0) -> subprocess.Popen:
        args = [str(self.db), self.job_id, str(self.root), kill, str(n)]
        with open(self.root / "child.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.serving.batch.crash_server", *args],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
            )  # fmt: skip

    def run(self, kill: str = "none", n: int = 0) -> int:
        """A feeder process to its end (the job's, or its kill point's); its exit status."""
        proc = self.start(kill, n)
        proc.communicate(timeout=CHILD_TIMEOUT_S)
        return proc.returncode

    def log(self, name: str) -> list[list[str]]:
        path = self.root / name
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def check(self) -> dict:
        """The store after a feeder process ended, however it ended, checked whole; the
        state of each item."""
        store = BatchStore(f"sqlite:///{self.db}")
        job, records = store.job(TENANT, self.job_id), store.results(TENANT, self.job_id)
        store.close()
        states = {r.index: r.state for r in records}
        committed = {i for i, s in states.items() if s in (DONE, FAILED)}
        for r in records:  # a result is the whole right one, or there is none
            if r.index in committed:
                assert r.result == result_for(r.index, body(r.index)), r
            else:
                assert r.state in (QUEUED, RUNNING) and r.result is None, r
        done = [i for i in committed if states[i] == DONE]
        assert (job.completed, job.failed) == (len(done), len(committed) - len(done))
        assert job.prompt_tokens == sum(i + 1 for i in done)  # each result counted once
        assert committed >= self.committed, "a committed result went missing"
        assert sum(s == RUNNING for s in states.values()) <= MAX_IN_FLIGHT
        runs = [int(line[0]) for line in self.log("runs.log")[self.runs_seen :]]
        assert len(runs) == len(set(runs)), "a process ran an item twice"
        rerun = self.committed.intersection(runs)
        assert not rerun, f"items with a committed result ran again: {sorted(rerun)}"
        self.ran.update(runs)
        self.committed, self.runs_seen = committed, self.runs_seen + len(runs)
        return states

    def finish(self) -> None:
        """Run the job to its end; then every item has its one right result, and each result
        was metered at most once (a kill between commit and metering loses the record)."""
        assert self.run() == 0, (self.root / "child.log").read_text()[-3000:]
        self.check()
        assert self.committed == set(range(TOTAL))
        assert set(self.ran) == set(range(TOTAL))
        store = BatchStore(f"sqlite:///{self.db}")
        job = store.job(TENANT, self.job_id)
        store.close()
        failing = sum("fail" in body(i) for i in range(TOTAL))
        assert (job.state, job.total, job.completed, job.failed) == (
            "done", TOTAL, TOTAL - failing, failing,
        )  # fmt: skip
        metered = Counter(int(line[0]) for line in self.log("metered.log"))
        assert max(metered.values()) == 1, "a result was metered twice"


@pytest.fixture
def crashes(tmp_path):
    c = Crashes(tmp_path)
    store = BatchStore(f"sqlite:///{c.db}")
    items = [NewItem(body(i), ref=f"r{i}") for i in range(TOTAL)]
    c.job_id = store.submit(tenant=TENANT, key_id="k", model="demo", api=WORKERS_AI,
                            endpoint="/ai/run", items=items).id  # fmt: skip
    store.close()
    return c


# (kill point, its occurrence): early and later in a process, each point more than once.
KILLS = [("claim", 3), ("mid-commit", 9), ("after-commit", 13),
         ("claim", 1), ("mid-commit", 1), ("after-commit", 1)]  # fmt: skip


def test_kills_at_each_commit_point_lose_and_repeat_nothing(crashes):
    """Each kill point does what it names (the child really died there, and the store shows
    it), and the job still ends with every result right and counted once."""
    for k, (kill, n) in enumerate(KILLS):
        rc = crashes.run(kill, n)
        assert rc == -signal.SIGKILL, f"{kill} {n}: exit {rc}, not killed"
        states = crashes.check()
        point, *hit = crashes.log("kills.log")[k]
        assert point == kill
        if kill == "claim":  # the claim committed: its items are running
            assert {states[int(i)] for i in hit} == {RUNNING}
        elif kill == "mid-commit":  # its result, counts and end check ran, but uncommitted
            index, updates = map(int, hit)
            assert updates == 3 and states[index] == RUNNING
        else:  # committed, then killed before metering: the result stays, unmetered
            index, recorded = int(hit[0]), hit[1]
            assert recorded == "True" and states[index] in (DONE, FAILED)
            metered = {int(line[0]) for line in crashes.log("metered.log")}
            assert index not in metered
    crashes.finish()
    assert sum(crashes.ran.values()) > TOTAL, "no item was interrupted and run again"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_kills_at_random_moments_lose_and_repeat_nothing(crashes, seed):
    """The parent SIGKILLs the feeder after a random delay, several times in a row (a restart
    killed soon after starting, too); the job still ends whole."""
    rng, killed = random.Random(seed), 0
    for _ in range(8):
        proc = crashes.start()
        assert proc.stdout.readline() == b"ready\n", (crashes.root / "child.log").read_text()
        try:
            proc.wait(timeout=rng.uniform(0.0, 0.1))  # 3 land: a job takes 0.5 s or more
        except subprocess.TimeoutExpired:
            proc.kill()
            killed += proc.wait() == -signal.SIGKILL
        proc.stdout.close()
        crashes.check()
        if len(crashes.committed) == TOTAL:
            break
    assert killed >= 3, f"only {killed} kills landed before the job ended"
    crashes.finish()


PROMPTS = ["def add(a, b):\n", "the quick brown fox", "Hello, world", "for i in range(3):", "x ="]
LORAS = ["upper", "rot13", "comment", None]
SERVED_ITEMS = 60


def greedy_body(i: int) -> dict:
    """Item i: greedy, so the same body gives the same answer alone or in any batch."""
    b = {"prompt": f"{PROMPTS[i % len(PROMPTS)]} {i}", "max_tokens": 8, "temperature": 0}
    return {**b, "lora": LORAS[i % 4]} if LORAS[i % 4] else b


@pytest.mark.slow
def test_a_served_batch_survives_its_server_killed_twice(tmp_path):
    """The one-process server is SIGKILLed while a Workers-AI batch runs, and again soon
    after its restart: results committed before each kill survive it, and once done the batch
    holds one response per item, each the answer of its body sent alone to the server."""
    server = KillableServer(tmp_path)
    bodies = [greedy_body(i) for i in range(SERVED_ITEMS)]
    try:
        server.start()
        refs = [{**b, "external_reference": f"r{i}"} for i, b in enumerate(bodies)]
        request_id = server.post({"requests": refs}, queue=True)["request_id"]
        before = server.wait_for(request_id, lambda r: r["completed"] >= 10)
        server.kill()
        assert before["status"] == "running", "the batch ended before the first kill"
        server.start()
        at_restart = server.post({"request_id": request_id})["completed"]
        assert at_restart >= before["completed"]  # what it reported was committed
        # Killed again as soon as the restart has run something (requeued items first).
        before = server.wait_for(request_id, lambda r: r["completed"] > at_restart)
        server.kill()
        assert before["status"] == "running", "the batch ended before the second kill"
        server.start()
        at_last_start = server.post({"request_id": request_id})["completed"]
        assert at_last_start >= before["completed"]
        result = server.wait_for(request_id, lambda r: r["status"] == "done")
        with ThreadPoolExecutor(4) as pool:  # each body alone, as an interactive request
            alone = list(pool.map(server.post, bodies))
        metered = batch_usage(server, at_least=SERVED_ITEMS - at_last_start)
    finally:
        server.kill()
    responses = result["responses"]
    assert [x["id"] for x in responses] == list(range(SERVED_ITEMS))
    assert [x["external_reference"] for x in responses] == [r["external_reference"] for r in refs]
    assert (result["completed"], result["failed"]) == (SERVED_ITEMS, 0)
    for i, (x, want) in enumerate(zip(responses, alone)):
        assert x["success"] and x["result"]["response"] == want["response"], (i, bodies[i])
    tokens = sum(x["result"]["usage"]["completion_tokens"] for x in responses)
    assert result["usage"]["completion_tokens"] == tokens  # each item counted once
    # Each item is metered once its result is committed: every item the last server ran is
    # metered, and no item twice (a kill between commit and metering loses a record instead).
    assert SERVED_ITEMS - at_last_start <= metered["requests"] <= SERVED_ITEMS
    assert metered["completion_tokens"] <= tokens


def batch_usage(server: KillableServer, at_least: int, timeout: float = 10) -> dict:
    """The batch counts of GET /v1/usage once they show at_least requests (metering follows
    each commit), or as they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(f"{server.url}/v1/usage?group_by=tenant", timeout=30).json()["data"]
        counts = Counter()
        for row in rows:
            counts.update(row["batch"])
        if counts["requests"] >= at_least or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)
