"""The registry's storage: a folder on any fsspec filesystem where files appear whole or not at all.

Every write goes to a temporary name in the destination folder and is then moved into
place: a rename on a local disk, a copy of a complete object on an object store. So a
reader, in this process or another, sees either the old file or the new one, never half
of one. Paths given to a Store are relative to its root and use '/'.

On a local disk a write is also durable when it returns: the temporary file is fsynced
before the rename, and the folder after it (with any folder the write created, in its
parent). So a file that makes another reachable (meta.json, a pointer) can only reach the
disk after what it refers to. Object stores make an object durable when its write returns.

create() makes a file only if it does not exist yet: O_EXCL on a local disk, fsspec's
mode "xb" elsewhere, serialized within this process (which is all memory:// spans);
whether "xb" is exclusive across processes on an object store depends on its backend.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from contextlib import contextmanager, nullcontext, suppress
from datetime import datetime

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from adapters.errors import AdapterError, RegistryCorrupt, RegistryUnavailable

TMP_PREFIX = ".tmp-"  # in-flight writes; readers and listings skip them
_EXCLUSIVE = threading.Lock()  # makes "xb" check-then-create atomic within this process


class Store:
    """A root folder behind an fsspec URL, with atomic writes and tolerant reads."""

    def __init__(self, uri: str, *, create: bool = True, **storage_options) -> None:
        """The store at uri, its root folder made if absent; with create=False an absent
        root raises RegistryUnavailable instead, so that reading a mistyped URI does not
        leave an empty registry behind."""
        if not isinstance(uri, str) or not uri:
            raise AdapterError("registry: a URL or folder is required (file://, memory://, s3://)")
        self.uri = uri
        try:
            self.fs, root = url_to_fs(uri, **storage_options)
        except (ImportError, ValueError) as exc:
            raise AdapterError(f"registry {uri!r}: cannot open it ({exc})") from None
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)  # fsync applies
        if not create:
            with self._io("check", ""):
                present = self.fs.isdir(self.root or "/")
            if not present:
                raise RegistryUnavailable(f"no registry at {uri}")
            return
        with self._io("create", ""):
            self.fs.makedirs(self.root or "/", exist_ok=True)

    def read(self, rel: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        with self._io("read", rel):
            try:
                # cat_file reads the object itself; an object store's cached listing may be stale.
                return self.fs.cat_file(self._path(rel))
            except FileNotFoundError:
                return None

    def read_json(self, rel: str) -> dict | None:
        """The file parsed as a JSON object, or None when it does not exist."""
        data = self.read(rel)
        if data is None:
            return None
        try:
            value = json.loads(data)
        except ValueError:  # UnicodeDecodeError included
            value = None
        if not isinstance(value, dict):
            raise RegistryCorrupt(f"registry {self.uri!r}: {rel} is corrupted (not a JSON object)")
        return value

    def write(self, rel: str, data: bytes) -> None:
        """Write data to rel so that no reader ever sees a partial file (durably, on a disk)."""
        parent, _, base = rel.rpartition("/")
        tmp = f"{parent}/{TMP_PREFIX}{uuid.uuid4().hex}-{base}"
        with self._io("write", rel):
            self._makedirs(parent)
            try:
                if self.local:
                    with self.fs.open(self._path(tmp), "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                else:
                    self.fs.pipe_file(self._path(tmp), data)
                self.fs.mv(self._path(tmp), self._path(rel))
            except BaseException:
                self._discard(tmp)
                raise
            self._sync_dir(parent)

    def write_json(self, rel: str, value: dict) -> None:
        """Write value as JSON to rel, atomically."""
        self.write(rel, _json(value))

    def create(self, rel: str, value: dict) -> bool:
        """Write value as JSON to rel only if rel does not exist: whether this call made it."""
        parent = rel.rpartition("/")[0]
        with self._io("create", rel):
            self._makedirs(parent)
            made = False
            try:
                lock = nullcontext() if self.local else _EXCLUSIVE
                with lock, self.fs.open(self._path(rel), "xb") as f:
                    made = True
                    f.write(_json(value))
                    if self.local:
                        f.flush()
                        os.fsync(f.fileno())
            except FileExistsError:
                return False
            except BaseException:
                # On a disk open() made the file, so a torn one is this call's to remove; an
                # object store writes it at close, or not at all.
                if made and self.local:
                    self._discard(rel)
                raise
            self._sync_dir(parent)
        return True

    def exists(self, rel: str) -> bool:
        """Whether rel exists now (not as an earlier listing remembered it)."""
        path = self._path(rel)
        with self._io("check", rel):
            self.fs.invalidate_cache(path)
            return self.fs.exists(path)

    def children(self, rel: str) -> list[str]:
        """Sorted base names of the entries in folder rel; [] when it does not exist."""
        path = self._path(rel)
        with self._io("list", rel):
            self.fs.invalidate_cache(path)
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
        names = {e.rstrip("/").rpartition("/")[2] for e in entries}
        return sorted(n for n in names if n and not n.startswith(TMP_PREFIX))

    def modified(self, rel: str) -> float | None:
        """Epoch seconds of the newest file at or under rel; None if absent or not reported."""
        path = self._path(rel)
        with self._io("stat", rel):
            self.fs.invalidate_cache(path)
            try:
                infos = self.fs.find(path, detail=True).values()
            except FileNotFoundError:
                return None
        times = [t for t in map(_mtime, infos) if t is not None]
        return max(times, default=None)

    def remove(self, rel: str) -> None:
        """Remove the file or folder rel and everything under it; absent is fine."""
        path = self._path(rel)
        with self._io("remove", rel):
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _makedirs(self, rel: str) -> None:
        """Create folder rel; on a disk, fsync each new folder into its parent."""
        path = self._path(rel)
        new = []
        if self.local:
            while path and not os.path.isdir(path) and path not in new:
                new.append(path)
                path = os.path.dirname(path)
        self.fs.makedirs(self._path(rel), exist_ok=True)
        for folder in reversed(new):
            _fsync_dir(os.path.dirname(folder))

    def _sync_dir(self, rel: str) -> None:
        if self.local:
            _fsync_dir(self._path(rel))

    def _discard(self, rel: str) -> None:
        """Best-effort removal of a temporary file after a failed write."""
        with suppress(OSError):
            self.fs.rm(self._path(rel))

    @contextmanager
    def _io(self, action: str, rel: str):
        """Turn the filesystem's OSError into RegistryUnavailable naming the registry and file."""
        try:
            yield
        except OSError as exc:
            where = f" {rel}" if rel else ""
            raise RegistryUnavailable(
                f"registry {self.uri!r}: cannot {action}{where} ({exc})"
            ) from exc


def _json(value: dict) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True).encode()


def _fsync_dir(path: str) -> None:
    """Make a folder's entries (a rename, a new file or folder) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mtime(info: dict) -> float | None:
    """A file's modification time from fsspec's info, whichever key the backend uses."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return None
