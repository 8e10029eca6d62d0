"""The batch store's room on disk: the free-space floor new work must leave, and whether a
failed write was a full disk."""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MIB = 2**20


def free_bytes(folder: Path) -> int:
    """Bytes free to this process on folder's disk: the one measure of the store's room."""
    return shutil.disk_usage(folder).free


def shortfall(folder: Path, min_free_bytes: int, size: int) -> str | None:
    """Why writing about size bytes into folder would leave its disk less than min_free_bytes
    free; None when it would not (or min_free_bytes is 0)."""
    if min_free_bytes <= 0:
        return None
    free = free_bytes(folder)
    if free - size >= min_free_bytes:
        return None
    return (f"its disk has {free // MIB} MiB free, and this write would leave less than the "
            f"{min_free_bytes // MIB} MiB kept free (batch.min_free_mb)")  # fmt: skip


def disk_full(exc: OSError | sqlite3.Error) -> bool:
    """Whether a store error is a full disk: SQLITE_FULL, or ENOSPC / EDQUOT from the OS."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return exc.errno in _FULL_ERRNOS
