"""Uploaded files (OpenAI's Files API) in the batch store's database: the files table."""

from __future__ import annotations

import secrets
import sqlite3
import time

from serving.batch.records import StoredFile

CHUNK_BYTES = 1 << 18  # what one read of a file's content holds (file_chunk)


def new_id(prefix: str) -> str:
    """A fresh id: prefix and 24 random hex digits."""
    return prefix + secrets.token_hex(12)


class FileQuotaFull(ValueError):
    """An upload that would take its tenant past its limit of files kept, or of their bytes."""

    def __init__(self, limit_name: str, used: int, limit: int, asked: int) -> None:
        # limit_name: "batch_files" (a count) or "batch_file_mb" (limit and figures in bytes)
        self.limit_name, self.used, self.limit, self.asked = limit_name, used, limit, asked
        super().__init__(f"{limit_name}: {used} used of {limit}, {asked} more asked")


class FileTable:
    """The file calls of BatchStore, over its connection (_write, _reading, _read_one, _room)."""

    def add_file(
        self, tenant: str, purpose: str, filename: str, content: bytes, *,
        max_files: int | None = None, max_bytes: int | None = None,
    ) -> StoredFile:  # fmt: skip
        """Store an uploaded file; committed on return. max_files and max_bytes: the most files
        and bytes the tenant may keep, this one's included (None: no limit); FileQuotaFull
        past either, counted in the transaction that inserts, so racing uploads cannot pass
        it together. StoreFull when the disk would keep less than the store's floor."""
        f = StoredFile(new_id("file-"), tenant, purpose, filename, len(content), time.time())
        self._room(len(content))
        with self._write() as db:
            count, size = file_totals(db, tenant)
            if max_files is not None and count + 1 > max_files:
                raise FileQuotaFull("batch_files", count, max_files, 1)
            if max_bytes is not None and size + f.bytes > max_bytes:
                raise FileQuotaFull("batch_file_mb", size, max_bytes, f.bytes)
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


def file_totals(db: sqlite3.Connection, tenant: str) -> tuple[int, int]:
    """(files, bytes) tenant keeps: what its file quotas count."""
    row = db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE tenant = ?",
                     (tenant,)).fetchone()  # fmt: skip
    return row[0], row[1]
