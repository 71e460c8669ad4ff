"""Bank archives in the database (component ``transfer_archives``), on SQLite or PostgreSQL.

:class:`SqlArchiveStore` implements :class:`heed.transfer.store.ArchiveStore`: a row
per archive in ``transfer_archives`` and its bytes in ``transfer_archive_parts`` (a
``BLOB`` on SQLite, ``BYTEA`` on PostgreSQL), one part per row and per transaction, so a
large archive never holds SQLite's writer for long and a cancel waits for one part. A row is
``complete`` only once its last part is stored; readers see complete rows only. A row is
recorded with its expected ``byte_size`` (the real one replaces it when complete), so a
tenant's export quota counts the exports being written too; the quota is checked under a
per-tenant lock (:meth:`~heed.storage.database.SqlDatabase.lock`) in the transaction that
records the row.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, Final

from heed.runtime import raise_if_cancelled
from heed.storage.database import Migration, SqlStore, from_row
from heed.transfer.store import (
    PART_BYTES,
    ExportQuota,
    ExportQuotaFull,
    ExportUsage,
    StoredArchive,
)

__all__ = ["MIGRATIONS", "SqlArchiveStore"]

#: Parts written per transaction (a cancel waits for one: a MiB written).
PARTS_PER_TRANSACTION: Final = 1
#: The lock a tenant's export quota is checked under.
QUOTA_LOCK: Final = "transfer-export-quota:"

MIGRATIONS: Final = [
    Migration(
        "transfer_archives",
        1,
        """
        CREATE TABLE transfer_archives (
            id {bytewise} PRIMARY KEY,
            tenant {bytewise} NOT NULL,
            kind TEXT NOT NULL,
            bank_id TEXT NOT NULL,
            filename TEXT NOT NULL,
            byte_size {bigint} NOT NULL,
            sha256 TEXT NOT NULL,
            complete INTEGER NOT NULL,
            created_at {real} NOT NULL,
            expires_at {real} NOT NULL
        );
        CREATE INDEX transfer_archives_expiry ON transfer_archives (expires_at);
        CREATE TABLE transfer_archive_parts (
            archive_id {bytewise} NOT NULL
                REFERENCES transfer_archives (id) ON DELETE CASCADE,
            part INTEGER NOT NULL,
            data {blob} NOT NULL,
            PRIMARY KEY (archive_id, part)
        );
        """,
        words={"sqlite": {"blob": "BLOB"}, "postgresql": {"blob": "BYTEA"}},
    ),
    Migration(
        "transfer_archives",
        2,
        # An export's reuse key (heed.transfer.runs: its parameters and records
        # digested), and a tenant's archives found by tenant (the export quota).
        """
        ALTER TABLE transfer_archives ADD COLUMN reuse_key TEXT;
        CREATE INDEX transfer_archives_tenant ON transfer_archives (tenant, kind, expires_at);
        """,
    ),
]


def _archive(row: Any) -> StoredArchive:
    return from_row(StoredArchive, row, ints=("byte_size",), floats=("created_at", "expires_at"))


class SqlArchiveStore(SqlStore):
    """Archives in parts (see the module docstring). Calls block."""

    migrations = MIGRATIONS

    def put_archive(
        self,
        archive: StoredArchive,
        parts: Iterable[bytes],
        quota: ExportQuota | None = None,
    ) -> StoredArchive:
        with self.db.write() as conn:
            if quota is not None:
                self.db.lock(conn, QUOTA_LOCK + archive.tenant)
                usage = self._usage(conn, archive.tenant, time.time())
                if usage.full(quota, archive.byte_size):
                    raise ExportQuotaFull(usage, quota, archive.byte_size)
            conn.execute(
                "INSERT INTO transfer_archives (id, tenant, kind, bank_id, filename,"
                " byte_size, sha256, complete, created_at, expires_at, reuse_key)"
                " VALUES (?,?,?,?,?,?,'',0,?,?,?)",
                (
                    archive.id,
                    archive.tenant,
                    archive.kind,
                    archive.bank_id,
                    archive.filename,
                    archive.byte_size,
                    archive.created_at,
                    archive.expires_at,
                    archive.reuse_key,
                ),
            )
        digest = hashlib.sha256()
        size = 0
        batch: list[tuple[str, int, bytes]] = []
        number = 0
        for part in parts:
            if len(part) > PART_BYTES:
                raise ValueError(f"a part of {len(part)} bytes; parts hold {PART_BYTES}")
            if not part:
                continue
            digest.update(part)
            size += len(part)
            batch.append((archive.id, number, bytes(part)))
            number += 1
            if len(batch) >= PARTS_PER_TRANSACTION:
                self._write_parts(batch)
                batch = []
        self._write_parts(batch)
        done = replace(archive, byte_size=size, sha256=digest.hexdigest())
        with self.db.write() as conn:
            conn.execute(
                "UPDATE transfer_archives SET byte_size = ?, sha256 = ?, complete = 1 WHERE id = ?",
                (done.byte_size, done.sha256, done.id),
            )
        return done

    def _write_parts(self, batch: list[tuple[str, int, bytes]]) -> None:
        if not batch:
            return
        raise_if_cancelled()
        with self.db.write() as conn:
            conn.executemany(
                "INSERT INTO transfer_archive_parts (archive_id, part, data) VALUES (?,?,?)",
                batch,
            )

    def get_archive(self, tenant: str, archive_id: str) -> StoredArchive | None:
        if "\x00" in tenant or "\x00" in archive_id:
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT * FROM transfer_archives WHERE id = ? AND tenant = ? AND complete = 1"
                " AND expires_at > ?",
                (archive_id, tenant, time.time()),
            ).fetchone()
        return _archive(row) if row is not None else None

    def archive_parts(self, archive_id: str) -> Iterator[bytes]:
        number = 0
        while True:
            raise_if_cancelled()
            with self.db.read() as conn:
                row = conn.execute(
                    "SELECT data FROM transfer_archive_parts WHERE archive_id = ? AND part = ?",
                    (archive_id, number),
                ).fetchone()
            if row is None:
                return
            yield bytes(row[0])
            number += 1

    def delete_archive(self, archive_id: str) -> bool:
        with self.db.write() as conn:
            conn.execute("DELETE FROM transfer_archive_parts WHERE archive_id = ?", (archive_id,))
            deleted = conn.execute(
                "DELETE FROM transfer_archives WHERE id = ?", (archive_id,)
            ).rowcount
        return bool(deleted)

    def export_usage(self, tenant: str, now: float) -> ExportUsage:
        with self.db.read() as conn:
            return self._usage(conn, tenant, now)

    @staticmethod
    def _usage(conn: Any, tenant: str, now: float) -> ExportUsage:
        row = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(byte_size), 0), MIN(expires_at)"
            " FROM transfer_archives WHERE tenant = ? AND kind = 'export' AND expires_at > ?",
            (tenant, now),
        ).fetchone()
        oldest = None if row[2] is None else float(row[2])
        return ExportUsage(int(row[0]), int(row[1]), oldest)

    def bank_exports(self, tenant: str, bank_id: str, now: float) -> list[StoredArchive]:
        if "\x00" in tenant or "\x00" in bank_id:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM transfer_archives WHERE tenant = ? AND kind = 'export'"
                " AND bank_id = ? AND complete = 1 AND expires_at > ?"
                " ORDER BY created_at DESC",
                (tenant, bank_id, now),
            ).fetchall()
        return [_archive(row) for row in rows]

    def renew_archive(self, archive_id: str, expires_at: float) -> StoredArchive | None:
        with self.db.write() as conn:
            row = conn.execute(
                "UPDATE transfer_archives SET expires_at = ?"
                " WHERE id = ? AND complete = 1 AND expires_at > ? RETURNING *",
                (expires_at, archive_id, time.time()),
            ).fetchone()
        return _archive(row) if row is not None else None

    def delete_expired(self, now: float) -> int:
        with self.db.read() as conn:
            ids = [
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM transfer_archives WHERE expires_at <= ?", (now,)
                ).fetchall()
            ]
        return sum(self.delete_archive(archive_id) for archive_id in ids)
