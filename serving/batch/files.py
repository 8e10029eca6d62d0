"""Uploaded files (OpenAI's Files API) in the batch store's database: the files table."""

from __future__ import annotations

import secrets
import time

from serving.batch.records import StoredFile


def new_id(prefix: str) -> str:
    """A fresh id: prefix and 24 random hex digits."""
    return prefix + secrets.token_hex(12)


class FileTable:
    """The file calls of BatchStore, over its connection (_write, _reading, _read_one)."""

    def add_file(self, tenant: str, purpose: str, filename: str, content: bytes) -> StoredFile:
        """Store an uploaded file; committed on return."""
        f = StoredFile(new_id("file-"), tenant, purpose, filename, len(content), time.time())
        with self._write() as db:
            db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (f.id, tenant, purpose, filename, f.bytes, f.created, content))  # fmt: skip
        return f

    def file(self, tenant: str, file_id: str) -> StoredFile | None:
        """tenant's file, None if it has none of that id."""
        row = self._read_one(
            "SELECT id, tenant, purpose, filename, bytes, created FROM files "
            "WHERE id = ? AND tenant = ?", (file_id, tenant),
        )  # fmt: skip
        return StoredFile(*row) if row else None

    def files(self, tenant: str) -> list[StoredFile]:
        """tenant's uploaded files, newest first."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT id, tenant, purpose, filename, bytes, created FROM files "
                "WHERE tenant = ? ORDER BY created DESC", (tenant,),
            ).fetchall()  # fmt: skip
        return [StoredFile(*row) for row in rows]

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        row = self._read_one(
            "SELECT content FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)
        )
        return bytes(row[0]) if row else None

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._write() as db:
            gone = db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
            return gone.rowcount > 0
