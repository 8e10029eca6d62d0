"""Usage rows a failed write could not commit, kept in a local append-only file until a later
write replays them, so that a full disk or a locked database never leaves traffic unbilled.

Each failed write appends one line, {"id": ..., "rows": [...]}, fsynced before record()
returns; the file is made 0600 (it says who used what). A replay reads every line under an
exclusive lock (flock: several processes may share the store, and so the spool), applies the
lines in order in the store's transaction, and truncates the file once that has committed.
A line's id is committed with its rows, so a replay whose truncate never happened (a crash, a
failing disk) skips it the next time: each line is counted exactly once.

A spool may instead be sent elsewhere (serving.usage.outbox): set_aside() renames it, under
its lock, to a file of its own (aside()), and the lines appended from then on start a new
spool; an append that was waiting for the lock then appends to the new one.
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("loraserve.usage")
# UsageStore's (minute, tenant, key_id, adapter, kind, requests, prompt, cached, completion,
# record id or None); an outbox's, a UsageRecord's fields
Row = tuple
ASIDE = ".aside"  # the suffix of a spool's lines set aside (set_aside)


class Spool:
    """The spool file at path: lines appended, read and cleared under an exclusive flock."""

    def __init__(self, path: str) -> None:
        self.path = path

    def empty(self) -> bool:
        """Whether no line waits (no file, or an empty one)."""
        try:
            return os.path.getsize(self.path) == 0
        except FileNotFoundError:
            return True

    def append(self, rows: list[Row]) -> None:
        """Add one line holding rows, durable (fsynced) on return; raises OSError if it cannot."""
        line = json.dumps({"id": uuid.uuid4().hex, "rows": rows}) + "\n"
        while True:
            made = not os.path.exists(self.path)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if made:
                    os.fchmod(fd, 0o600)  # the umask may have taken the owner's bits too
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not _is_at(fd, self.path):  # set aside while this waited: a new spool
                    continue
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash: end it
                    line = "\n" + line
                os.write(fd, line.encode())
                os.fsync(fd)
                break
            finally:
                os.close(fd)
        if made:  # the file's name must survive a crash too
            folder = os.open(Path(self.path).parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

    def set_aside(self) -> None:
        """Rename the spool's lines, under its lock, to a file of their own beside it (listed
        by aside(), oldest first); later appends start a new spool. Nothing if none waits."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size and _is_at(fd, self.path):
                stamp = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"  # sorts oldest first
                os.rename(self.path, f"{self.path}.{stamp}{ASIDE}")
        finally:
            os.close(fd)

    def aside(self) -> list[str]:
        """The files of lines set aside and not yet deleted, oldest first."""
        return sorted(glob.glob(f"{glob.escape(self.path)}.*{ASIDE}"))

    @contextmanager
    def held(self) -> Iterator[list[tuple[str, list[Row]]]]:
        """The spooled lines, (id, rows) in order, held locked while the block runs; cleared
        when it ends without raising. No file or an empty one: [] and nothing locked."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            yield []
            return
        try:
            if os.fstat(fd).st_size == 0:
                yield []
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as f:
                entries = _parse(f.read())
            yield entries
            self._clear(fd)
        finally:
            os.close(fd)

    def _clear(self, fd: int) -> None:
        """Empty the file once its lines are committed; a failure only leaves them to be
        skipped by id at the next replay."""
        try:
            os.ftruncate(fd, 0)
            os.fsync(fd)
        except OSError as exc:
            log.warning("usage spool %s: replayed, but cannot be emptied: %s", self.path, exc)


def read_lines(path: str) -> list[tuple[str, list[Row]]]:
    """The lines, (id, rows), of a spool file (one set aside); FileNotFoundError if it is gone."""
    with open(path, "rb") as f:
        return _parse(f.read())


def _is_at(fd: int, path: str) -> bool:
    """Whether the open file fd is still the one named path (not renamed away, or replaced)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (here.st_dev, here.st_ino)


def _parse(data: bytes) -> list[tuple[str, list[Row]]]:
    entries = []
    for number, line in enumerate(data.splitlines(), 1):
        try:
            entry = json.loads(line)
            entries.append((entry["id"], [tuple(row) for row in entry["rows"]]))
        except (ValueError, KeyError, TypeError):  # torn by a crash before its write returned
            if line.strip():
                log.warning("usage spool: line %d is incomplete and skipped", number)
    return entries
