"""Concurrent publishers (threads with readers racing them, and processes) leave the
registry consistent and holding exactly what was published; concurrent creators of one
new name end with one winner."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest
from fsspec.core import url_to_fs

from adapters.errors import NameConflict, UnknownAdapter
from adapters.registry import publishing
from adapters.registry.registry import Registry
from tests.adapters.registry.helpers import assert_consistent, make_adapter


def _worker_jobs(i: int) -> list[tuple[str, int]]:
    """(name, seed) pairs: one name for all with different content, one's own, shared content."""
    return [("shared", 100 + i), (f"own-{i}", 200 + i), ("common", 7), ("shared", 300 + i)]


def _create_shared_names(uri: str) -> None:
    """Names every worker publishes to exist before the race: creating one is a race of its
    own (test_concurrent_creates), won by one creator."""
    reg = Registry(uri)
    for name, seed in (("shared", 99), ("common", 7)):
        reg.publish(name, make_adapter(seed=seed))


def _publish_jobs(uri: str, i: int, barrier) -> None:
    """Wait for every worker, then publish worker i's jobs. Runs in threads and processes."""
    reg = Registry(uri)
    adapters = [(name, make_adapter(seed=seed)) for name, seed in _worker_jobs(i)]
    barrier.wait()
    for name, adapter in adapters:
        reg.publish(name, adapter)


def _check_after_race(uri: str, workers: int) -> None:
    """The registry is consistent and holds exactly what the workers published."""
    assert_consistent(uri)
    reg = Registry(uri)
    seeds = {seed for i in range(workers) for _, seed in _worker_jobs(i)}
    digest = {seed: make_adapter(seed=seed).digest for seed in seeds}
    names = ["common", "shared", *(f"own-{i}" for i in range(workers))]
    assert [e.name for e in reg.list()] == sorted(names)
    digest[99] = make_adapter(seed=99).digest
    shared = {digest[s] for i in range(workers) for name, s in _worker_jobs(i) if name == "shared"}
    shared.add(digest[99])
    entry = reg.show("shared")
    assert entry.digest in shared and set(entry.history) == shared
    assert reg.show("common").history == (digest[7],)
    fs, root = url_to_fs(uri)
    stored = {p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(f"{root}/versions", detail=False)}
    assert stored == set(digest.values())


def test_concurrent_threads(uri):
    workers, readers = 8, 2
    _create_shared_names(uri)
    barrier = threading.Barrier(workers + readers)
    done = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as exc:
            errors.append(exc)

    def read():
        # Readers racing the publishers see a whole version or no name, never half a file.
        reg = Registry(uri)
        barrier.wait()
        while not done.is_set():
            try:
                reg.load("shared")
            except UnknownAdapter as exc:  # until the first publish lands
                assert "unknown adapter 'shared'" in str(exc)
            reg.list()

    threads = [
        threading.Thread(target=guarded, args=(_publish_jobs, uri, i, barrier))
        for i in range(workers)
    ]
    threads += [threading.Thread(target=guarded, args=(read,)) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads[:workers]:
        t.join()
    done.set()
    for t in threads[workers:]:
        t.join()
    assert not errors
    _check_after_race(uri, workers)


def test_concurrent_processes(tmp_path):
    uri = f"file://{tmp_path / 'registry'}"
    workers = 4
    _create_shared_names(uri)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_publish_jobs, args=(uri, i, barrier)) for i in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * workers
    _check_after_race(uri, workers)


def test_concurrent_creates(tmp_path, monkeypatch):
    """Many creators of one tenant's new name, each with its own content: one wins."""
    uri = f"file://{tmp_path / 'registry'}"
    workers = 12
    adapters = [make_adapter(seed=500 + i) for i in range(workers)]
    barrier = threading.Barrier(workers)
    outcome: list[object] = [None] * workers
    # Every creator has found the name absent before any stores its version and claims it;
    # one that came after the winner's pointer would be an update, not a create.
    looked = threading.Barrier(workers)
    first_call = threading.local()
    store_version = publishing.store_version

    def store_after_all_looked(*args):
        if not getattr(first_call, "done", False):
            first_call.done = True
            looked.wait(30)
        return store_version(*args)

    monkeypatch.setattr(publishing, "store_version", store_after_all_looked)

    def create(i: int) -> None:
        reg = Registry(uri)
        barrier.wait()
        try:
            outcome[i] = reg.publish("support-bot", adapters[i], owner="acme")
        except NameConflict as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=create, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in enumerate(outcome) if not isinstance(o, NameConflict)]
    assert len(winners) == 1, outcome
    assert all(isinstance(o, NameConflict) for i, o in enumerate(outcome) if i != winners[0])
    reg = Registry(uri)
    entry = reg.show("support-bot", "acme")
    assert entry.digest == adapters[winners[0]].digest
    assert entry.history == (entry.digest,)
    assert_consistent(uri)


def test_a_claim_without_a_pointer_blocks_creates_until_it_is_stale(uri):
    """A creator that crashed after its claim: the name is taken for CLAIM_TTL_S, then free."""
    reg = Registry(uri)
    fs, root = url_to_fs(uri)
    claim = f"{root}/tenants/acme/names/bot/claim"
    fs.makedirs(claim.rpartition("/")[0], exist_ok=True)
    record = {"tenant": "acme", "name": "bot", "token": "crashed", "created": time.time()}
    fs.pipe_file(claim, json.dumps(record).encode())
    with pytest.raises(NameConflict, match="'bot' is being created"):
        reg.publish("bot", make_adapter(seed=1), owner="acme")
    assert not reg.exists("bot", "acme")
    fs.pipe_file(claim, json.dumps({**record, "created": time.time() - 61}).encode())
    assert reg.publish("bot", make_adapter(seed=1), owner="acme").owner == "acme"
    assert json.loads(fs.cat_file(claim))["token"] != "crashed"
