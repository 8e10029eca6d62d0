"""The batch store's files (the database, its -wal and -shm) and the folders it makes are
private to their owner whatever the umask; an older store's looser files are made private."""

import pytest

from serving.batch.store import BatchStore
from tests.serving.batch.test_store import submit
from tests.serving.file_modes import loose_database, modes, umask

FILES = ("batch.db", "batch.db-wal", "batch.db-shm")


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o277], ids=oct)
def test_a_new_store_and_its_folders_are_private(tmp_path, mask):
    folder = tmp_path / "state" / "batch"
    with umask(mask):
        store = BatchStore(f"sqlite:///{folder / 'batch.db'}")
        job = submit(store, 2)
    try:
        assert modes(folder) == dict.fromkeys(FILES, 0o600)
        assert modes(tmp_path) == {"state": 0o700} and modes(tmp_path / "state") == {"batch": 0o700}
        assert store.job("acme", job.id).total == 2
    finally:
        store.close()


def test_an_older_stores_loose_files_are_made_private(tmp_path):
    path = tmp_path / "batch.db"
    old = loose_database(path)
    folder_mode = tmp_path.stat().st_mode
    store = BatchStore(f"sqlite:///{path}")
    try:
        assert modes(tmp_path) == dict.fromkeys(FILES, 0o600)
        assert store.job("acme", submit(store, 1).id).total == 1
    finally:
        store.close()
        old.close()
    assert tmp_path.stat().st_mode == folder_mode  # a folder it did not make keeps its mode
