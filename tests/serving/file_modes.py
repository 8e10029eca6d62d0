"""Helpers for the stores' file-mode tests: a umask for a while, and a folder's modes."""

import os
import sqlite3
import stat
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def umask(mask: int):
    """This process's umask set to mask, then put back."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def modes(folder: Path) -> dict[str, int]:
    """Each entry of folder, by name, with its permission bits."""
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}


def loose_database(path: Path) -> sqlite3.Connection:
    """A WAL database at path made 0644 by an older version, its connection left open so its
    -wal and -shm files stay (0644 too)."""
    with umask(0o022):
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE IF NOT EXISTS old (x)")
    assert set(modes(path.parent).values()) == {0o644}
    return db
