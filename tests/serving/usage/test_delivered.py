"""Records that carry an id (those a replica may send twice) are counted the first time their
id comes: sent again, in one call, through the store's own spool, or after a restart; their
ids are kept DELIVERED_KEEP_S, and records without one are summed as before."""

import dataclasses
import sqlite3
import time

from serving.usage import store as store_module
from serving.usage.store import UsageStore
from tests.serving.usage.test_spool import locked, opened, requests
from tests.serving.usage.test_store import _rec

NOW = time.time()


def _sent(record_id: str, **fields):
    return dataclasses.replace(_rec(time=NOW, **fields), id=record_id)


def test_a_record_sent_again_is_counted_once_and_others_are_summed(tmp_path):
    store = opened(tmp_path / "usage.db")
    store.record([_sent("a"), _sent("a"), _sent("b"), _rec(time=NOW), _rec(time=NOW)])
    assert requests(store) == 4  # "a" once, "b", and the two without ids
    store.record([_sent("a"), _sent("b", completion_tokens=99)])  # both again: nothing
    totals = store.totals()["interactive"]
    assert totals["requests"] == 4 and totals["completion_tokens"] == 4 * 5
    store.close()
    again = opened(tmp_path / "usage.db")
    again.record([_sent("a")])  # the ids outlive a restart
    assert requests(again) == 4
    again.close()


def test_a_record_spooled_by_the_store_and_sent_again_meanwhile_is_counted_once(tmp_path):
    path = tmp_path / "usage.db"
    store = opened(path)
    with locked(path):
        store.record([_sent("a"), _sent("b")])  # the store's spool keeps them, with their ids
        store.record([_sent("a")])  # sent again before any replay: spooled again
    store.record([_sent("b"), _sent("c")])  # replays the spool first, then these
    assert requests(store) == 3
    store.close()


def test_ids_are_forgotten_after_the_window(tmp_path, monkeypatch):
    store = opened(tmp_path / "usage.db")
    store.record([_sent("a")])
    ids = "SELECT COUNT(*) FROM usage_delivered"
    assert store._db.execute(ids).fetchone()[0] == 1
    later = NOW + store_module.DELIVERED_KEEP_S + 120
    monkeypatch.setattr(store_module.time, "time", lambda: later)
    store.record([_rec(time=later)])  # any write drops the ids past the window
    assert store._db.execute(ids).fetchone()[0] == 0
    store.close()


def test_an_older_store_file_gets_the_ids_table(tmp_path):
    path = tmp_path / "usage.db"
    UsageStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE usage_delivered")  # as a version before ids left it
    store = opened(path)
    store.record([_sent("a"), _sent("a")])
    assert requests(store) == 1
    store.close()
