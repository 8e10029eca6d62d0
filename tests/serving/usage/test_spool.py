"""Usage written while the store fails (locked past its busy timeout, a full disk) is spooled
beside it (0600) and replayed, in order and exactly once, by the next write that succeeds or
the next start, even when a replay committed but could not empty the spool."""

import sqlite3
import stat
from contextlib import contextmanager

import pytest

from serving.usage import spool as spool_module
from serving.usage.store import UsageStore
from tests.serving.usage.test_store import _rec


@pytest.fixture
def path(tmp_path):
    return tmp_path / "usage.db"


def opened(path) -> UsageStore:
    store = UsageStore(f"sqlite:///{path}")
    store._db.execute("PRAGMA busy_timeout = 50")  # a lock fails fast, not in 30 s
    return store


@contextmanager
def locked(path):
    """Another process's write transaction, held: the store's writes fail as locked."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def requests(store, **query) -> int:
    return store.totals(**query)["interactive"]["requests"]


def test_writes_that_fail_are_replayed_once_by_the_next_that_succeeds(path):
    store = opened(path)
    store.record([_rec()])
    with locked(path):
        store.record([_rec(completion_tokens=7)])  # no error: spooled
        store.record([_rec(tenant="globex"), _rec(tenant="globex")])
    spool = path.parent / "usage.db-spool.jsonl"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o600
    assert len(spool.read_text().splitlines()) == 2  # one line per failed write
    assert requests(store) == 1  # not counted yet
    store.record([_rec(tenant="other")])  # succeeds, and replays the spool first
    assert requests(store, tenant="acme") == 2 and requests(store, tenant="globex") == 2
    assert store.totals(tenant="acme")["interactive"]["completion_tokens"] == 12
    assert spool.read_text() == ""
    store.record([_rec(tenant="other")])  # nothing replayed twice
    assert requests(store) == 6
    store.close()


def test_a_restart_replays_what_the_last_run_spooled_exactly_once(path):
    store = opened(path)
    with locked(path):
        store.record([_rec(), _rec(adapter="acme/bot")])
    store.close()
    assert requests(UsageStore(f"sqlite:///{path}")) == 2  # replayed at start
    again = UsageStore(f"sqlite:///{path}")
    assert requests(again) == 2
    again.close()


def test_a_replay_that_cannot_empty_the_spool_is_not_counted_twice(path, monkeypatch):
    store = opened(path)
    with locked(path):
        store.record([_rec()])
    kept = spool_module.Spool._clear
    monkeypatch.setattr(spool_module.Spool, "_clear", lambda self, fd: None)  # as if it crashed
    store.record([_rec(tenant="globex")])
    assert requests(store, tenant="acme") == 1
    monkeypatch.setattr(spool_module.Spool, "_clear", kept)
    store.record([_rec(tenant="globex")])  # the same line again: skipped by its id
    assert requests(store, tenant="acme") == 1 and requests(store, tenant="globex") == 2
    store.close()
    again = opened(path)
    with locked(path):
        again.record([_rec()])
    again.record([_rec(tenant="globex")])
    assert requests(again, tenant="acme") == 2 and requests(again, tenant="globex") == 3
    again.close()


def test_a_line_torn_by_a_crash_is_skipped_and_later_lines_still_count(path):
    store = opened(path)
    spool = path.parent / "usage.db-spool.jsonl"
    spool.write_text('{"id": "torn", "rows": [[0, "ac')  # a write that never returned
    with locked(path):
        store.record([_rec()])
    store.record([_rec(tenant="globex")])
    assert requests(store, tenant="acme") == 1 and requests(store) == 2
    store.close()


def test_a_spool_that_cannot_be_written_either_raises(path, tmp_path):
    store = opened(path)
    store._spool.path = str(tmp_path / "missing" / "spool.jsonl")
    with locked(path), pytest.raises(Exception, match="nor can its spool take it"):
        store.record([_rec()])
    store.close()
