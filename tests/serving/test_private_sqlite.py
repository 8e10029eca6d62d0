"""The batch and usage stores' files (the database, its -wal and -shm) and the folders they
make are private to their owner whatever the umask (serving/private_sqlite.py); an older
store's looser files are made private when it is opened."""

import pytest

from serving.batch.store import BatchStore
from serving.usage.store import UsageStore
from tests.serving.batch.test_store import submit
from tests.serving.file_modes import loose_database, modes, umask
from tests.serving.usage.test_store import _rec


def _batch_writes(store) -> None:
    assert store.job("acme", submit(store, 2).id).total == 2


def _usage_writes(store) -> None:
    store.record([_rec()])
    assert store.totals()["interactive"]["requests"] == 1


STORES = {"batch": (BatchStore, _batch_writes), "usage": (UsageStore, _usage_writes)}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("mask", [0o022, 0o000, 0o277], ids=oct)
def test_a_new_store_and_its_folders_are_private(tmp_path, kind, mask):
    make, writes = STORES[kind]
    folder = tmp_path / "state" / kind
    with umask(mask):
        store = make(f"sqlite:///{folder / f'{kind}.db'}")
        writes(store)
    try:
        files = (f"{kind}.db", f"{kind}.db-wal", f"{kind}.db-shm")
        assert modes(folder) == dict.fromkeys(files, 0o600)
        assert modes(tmp_path) == {"state": 0o700} and modes(tmp_path / "state") == {kind: 0o700}
    finally:
        store.close()


@pytest.mark.parametrize("kind", STORES)
def test_an_older_stores_loose_files_are_made_private(tmp_path, kind):
    make, writes = STORES[kind]
    path = tmp_path / f"{kind}.db"
    old = loose_database(path)
    folder_mode = tmp_path.stat().st_mode
    store = make(f"sqlite:///{path}")
    try:
        files = (f"{kind}.db", f"{kind}.db-wal", f"{kind}.db-shm")
        assert modes(tmp_path) == dict.fromkeys(files, 0o600)
        writes(store)
    finally:
        store.close()
        old.close()
    assert tmp_path.stat().st_mode == folder_mode  # a folder it did not make keeps its mode
