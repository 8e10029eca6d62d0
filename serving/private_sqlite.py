"""SQLite files only their owner may read or write (0600), whatever the umask.

The stores hold prompts, results and who used what, so another account on the machine must
not read them. A new database file is made 0600 before SQLite opens it, and the folders made
for it 0700; SQLite gives the -wal and -shm files it makes the database's own mode. A file
made looser by an older version (its -wal and -shm too) loses its group and other bits.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

log = logging.getLogger("loraserve")

MEMORY = ":memory:"


def connect_private(path: str) -> sqlite3.Connection:
    """An autocommit connection, shareable across threads, to the owner-only database at path."""
    if path != MEMORY:
        _make_folders(Path(path).parent)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            _restrict(path)
        else:
            os.fchmod(fd, 0o600)  # the umask may have taken the owner's bits too
            os.close(fd)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    if path != MEMORY:
        for suffix in ("-wal", "-shm"):  # left by an earlier process, perhaps looser
            _restrict(path + suffix)
    return db


def _make_folders(folder: Path) -> None:
    """folder and its missing parents, each made 0700; folders already there are left as they are."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        try:
            each.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            continue
        each.chmod(0o700)


def _restrict(path: str) -> None:
    """Take the group's and others' bits off an existing file; a warning if that is refused."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            os.chmod(path, mode & 0o700)
    except FileNotFoundError:
        pass
    except OSError as exc:  # another account's file: it still opens, as before
        log.warning("%s: group or others may read it, and it cannot be made private: %s", path, exc)
