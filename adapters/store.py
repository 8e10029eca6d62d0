"""The registry's storage: a folder on any fsspec filesystem where files appear whole or not at all.

Every write goes to a temporary name in the destination folder and is then moved into
place: a rename on a local disk, a copy of a complete object on an object store. So a
reader, in this process or another, sees either the old file or the new one, never half
of one. Paths given to a Store are relative to its root and use '/'.
"""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager, suppress

from fsspec.core import url_to_fs

from adapters.errors import AdapterError

TMP_PREFIX = ".tmp-"  # in-flight writes; readers and listings skip them


class Store:
    """A root folder behind an fsspec URL, with atomic writes and tolerant reads."""

    def __init__(self, uri: str, **storage_options) -> None:
        if not isinstance(uri, str) or not uri:
            raise AdapterError("registry: a URL or folder is required (file://, memory://, s3://)")
        self.uri = uri
        try:
            self.fs, root = url_to_fs(uri, **storage_options)
        except (ImportError, ValueError) as exc:
            raise AdapterError(f"registry {uri!r}: cannot open it ({exc})") from None
        self.root = root.rstrip("/")
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
            raise AdapterError(f"registry {self.uri!r}: {rel} is corrupted (not a JSON object)")
        return value

    def write(self, rel: str, data: bytes) -> None:
        """Write data to rel so that no reader ever sees a partial file."""
        parent, _, base = rel.rpartition("/")
        tmp = f"{parent}/{TMP_PREFIX}{uuid.uuid4().hex}-{base}"
        with self._io("write", rel):
            self.fs.makedirs(self._path(parent), exist_ok=True)
            try:
                self.fs.pipe_file(self._path(tmp), data)
                self.fs.mv(self._path(tmp), self._path(rel))
            except BaseException:
                self._discard(tmp)
                raise

    def write_json(self, rel: str, value: dict) -> None:
        """Write value as JSON to rel, atomically."""
        self.write(rel, json.dumps(value, indent=2, sort_keys=True).encode())

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

    def remove(self, rel: str) -> None:
        """Remove the file or folder rel and everything under it; absent is fine."""
        path = self._path(rel)
        with self._io("remove", rel):
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _discard(self, rel: str) -> None:
        """Best-effort removal of a temporary file after a failed write."""
        with suppress(OSError):
            self.fs.rm(self._path(rel))

    @contextmanager
    def _io(self, action: str, rel: str):
        """Turn the filesystem's OSError into an AdapterError naming the registry and file."""
        try:
            yield
        except OSError as exc:
            where = f" {rel}" if rel else ""
            raise AdapterError(f"registry {self.uri!r}: cannot {action}{where} ({exc})") from exc
