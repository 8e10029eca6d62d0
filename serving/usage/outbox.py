"""Usage records a process could not hand to the Tenancy (unreachable, restarting, too slow
to answer), kept on this machine's disk until it takes them, so traffic is never unbilled.

Records are appended to a spool (serving.usage.spool: 0600, fsynced before keep() returns).
To send them, take() sets the spool aside (a rename: records kept meanwhile start a new one)
and reads every file set aside; a file is deleted (sent()) once the Tenancy has committed
all it holds, else it is sent again later, by this process or another on the machine. Each
record carries an id the usage store counts once (UsageStore.record), so a record sent twice
(a first delivery that committed though no answer came, one file taken by two processes) is
still counted once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from serving.usage.record import UsageRecord
from serving.usage.spool import Row, Spool, read_lines

log = logging.getLogger("loraserve.usage")
OUTBOX_FILE = "loraserve-usage-outbox.jsonl"


def with_id(record: UsageRecord) -> UsageRecord:
    """record with an id of its own (64 random bits, counted once in its minute), if it has none."""
    return record if record.id is not None else dataclasses.replace(record, id=secrets.token_hex(8))


class Outbox:
    """Records waiting for the Tenancy, in the spool at path and the files set aside from it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._spool = Spool(path)

    def keep(self, records: Sequence[UsageRecord]) -> None:
        """Append records, each with its id, durable on return; OSError if the disk refuses."""
        if any(r.id is None for r in records):
            raise ValueError("a usage record kept to send again needs an id (with_id)")
        self._spool.append([dataclasses.astuple(r) for r in records])

    def waiting(self) -> bool:
        """Whether any record waits, in the spool or set aside."""
        return not self._spool.empty() or bool(self._spool.aside())

    def take(self) -> list[tuple[str, list[UsageRecord]]]:
        """Every file of waiting records, oldest first (the spool set aside now last), with its
        records; call sent(file) once the Tenancy has committed them."""
        self._spool.set_aside()
        taken = []
        for path in self._spool.aside():
            with contextlib.suppress(FileNotFoundError):  # sent meanwhile by another process
                taken.append((path, _records(path, read_lines(path))))
        return taken

    def sent(self, path: str) -> None:
        """Delete a file taken, its records committed by the Tenancy."""
        with contextlib.suppress(FileNotFoundError):  # another process sent it too
            os.unlink(path)


def outbox_for(store_url: str) -> Outbox | None:
    """The outbox of this machine's processes that send usage to a Tenancy, or that hold a
    store, at store_url: beside that store where its folder is here and writable (the head
    node, one machine), else in a private folder of the temp dir (a worker node, where the
    stores' volume is not mounted). None for a store in memory, which outlives nothing."""
    path = store_url.removeprefix("sqlite:///")
    if path in ("", ":memory:"):
        return None
    folder = Path(path).parent
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        folder = _private_temp()
    return Outbox(str(folder / OUTBOX_FILE))


def _private_temp() -> Path:
    """A folder of the temp dir only this account uses (0700), the same for its processes;
    a fresh one if that name is another account's or not a folder."""
    folder = Path(tempfile.gettempdir()) / f"loraserve-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        return Path(tempfile.mkdtemp(prefix="loraserve-"))
    if stat.S_IMODE(found.st_mode) != 0o700:
        folder.chmod(0o700)
    return folder


def _records(path: str, lines: list[tuple[str, list[Row]]]) -> list[UsageRecord]:
    records = []
    for _, rows in lines:
        for row in rows:
            try:
                records.append(UsageRecord(*row))
            except (TypeError, ValueError) as exc:  # never a record: it would block the rest
                log.error(
                    "usage outbox %s: a line that is no usage record is skipped: %s", path, exc
                )
    return records
