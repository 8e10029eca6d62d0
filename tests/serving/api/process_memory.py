"""What this process holds, read two ways: glibc's heap in use (where native libraries'
memory shows: torch, oneDNN, tokenizers, SQLite) and Python's objects counted by type."""

from __future__ import annotations

import collections
import ctypes
import gc


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h), every field a size_t, in this order
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def heap_in_use() -> int | None:
    """Bytes glibc's malloc has handed out and not had back (arenas and mmapped blocks);
    None where the C library has no mallinfo2 (not glibc, or glibc before 2.33)."""
    try:
        read = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    read.restype = _MallInfo2
    info = read()
    return info.uordblks + info.hblkhd


def objects_by_type() -> collections.Counter:
    """How many objects the garbage collector tracks, by type name, after a collection."""
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())
