"""The terminal of `loraserve serve`: our own lines there, everything Ray writes in a log file.

Ray writes to this process's stdout and stderr from many places: Python loggers (the
token-authentication notice, start-up steps), the lines its log monitor forwards from the
raylet and the Serve actors (`(raylet) ...`, `(ServeController pid=...) ...`), warnings, and
the C++ core worker, which writes to file descriptor 2 directly. Python-level routing would
miss the last, so the redirect is made on the descriptors themselves: 1 and 2 point at the log
file while Ray runs, and our lines go to a copy of the original stdout.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def new_log_path() -> Path:
    """A fresh serve-<time>-<pid>.log under ~/.local/state/loraserve/logs (else the temp dir)."""
    name = f"serve-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        folder = state / "loraserve" / "logs"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home, or a read-only one
        folder = Path(tempfile.gettempdir()) / f"loraserve-logs-{os.getuid()}"
        folder.mkdir(parents=True, exist_ok=True)
    return folder / name


@contextmanager
def quiet_console(log_path: Path) -> Iterator[TextIO]:
    """Point stdout and stderr (the descriptors) at log_path; yield a stream to the terminal.

    On exit, even by an exception, the descriptors are restored, so an error the caller
    reports afterwards reaches the terminal.
    """
    # Ray colours the prefixes of forwarded lines; escape codes only clutter a file.
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup(saved_out), "w", buffering=1)  # line-buffered: lines show at once
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        terminal.close()
