"""Uploaded files (OpenAI's Files API) in the batch store's database: the files table."""

from __future__ import annotations

import secrets
import time

from serving.batch.records import StoredFile

CHUNK_BYTES = 1 << 18  # what one read of a file's content holds (file_chunk)


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

    def files(
        self, tenant: str, *, purpose: str | None = None, limit: int = 10_000,
        after: str | None = None, ascending: bool = False,
    ) -> list[StoredFile]:  # fmt: skip
        """tenant's uploaded files of purpose (None: any), newest first (ascending: oldest
        first), at most limit of them, from the one after the file id after."""
        where, args = ["tenant = ?"], [tenant]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after is not None:  # an unknown id compares as NULL: nothing follows it
            where.append(f"(created, id) {'>' if ascending else '<'} "
                         "(SELECT created, id FROM files WHERE id = ? AND tenant = ?)")  # fmt: skip
            args += [after, tenant]
        way = "ASC" if ascending else "DESC"
        with self._reading() as db:
            rows = db.execute(
                "SELECT id, tenant, purpose, filename, bytes, created FROM files WHERE "
                f"{' AND '.join(where)} ORDER BY created {way}, id {way} LIMIT ?", (*args, limit),
            ).fetchall()  # fmt: skip
        return [StoredFile(*row) for row in rows]

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        row = self._read_one(
            "SELECT content FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)
        )
        return bytes(row[0]) if row else None

    def file_chunk(self, tenant: str, file_id: str, offset: int) -> bytes | None:
        """Up to CHUNK_BYTES of tenant's file from offset (b"" past its end), read from the
        stored blob without loading the rest of it; None if it has no file of that id."""
        with self._reading() as db:
            row = db.execute("SELECT rowid FROM files WHERE id = ? AND tenant = ?",
                             (file_id, tenant)).fetchone()  # fmt: skip
            if row is None:
                return None
            with db.blobopen("files", "content", row[0], readonly=True) as blob:
                blob.seek(min(offset, len(blob)))
                return blob.read(CHUNK_BYTES)

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._write() as db:
            gone = db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
            return gone.rowcount > 0
