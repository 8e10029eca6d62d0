"""Concurrent publishers (threads with readers racing them, and processes) leave the
registry consistent and holding exactly what was published."""

from __future__ import annotations

import multiprocessing
import threading

from fsspec.core import url_to_fs

from adapters.errors import AdapterError
from adapters.registry import Registry
from tests.adapters.registry_helpers import assert_consistent, make_adapter


def _worker_jobs(i: int) -> list[tuple[str, int]]:
    """(name, seed) pairs: one name for all with different content, one's own, shared content."""
    return [("shared", 100 + i), (f"own-{i}", 200 + i), ("common", 7), ("shared", 300 + i)]


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
    shared = {digest[s] for i in range(workers) for name, s in _worker_jobs(i) if name == "shared"}
    entry = reg.show("shared")
    assert entry.digest in shared and set(entry.history) == shared
    assert reg.show("common").history == (digest[7],)
    fs, root = url_to_fs(uri)
    stored = {p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(f"{root}/versions", detail=False)}
    assert stored == set(digest.values())


def test_concurrent_threads(uri):
    workers, readers = 8, 2
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
            except AdapterError as exc:  # until the first publish lands
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
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_publish_jobs, args=(uri, i, barrier)) for i in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * workers
    _check_after_race(uri, workers)
