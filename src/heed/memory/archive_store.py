"""Where bank archives wait: an export's result until it is downloaded, an upload until its
import has run. :class:`heed.storage.archive_store.SqlArchiveStore` implements
:class:`ArchiveStore` in the server's database (SQLite or PostgreSQL), so any process
sharing that database serves any archive: a download may reach another instance than the
export, an import may run on another instance than the upload.

An archive is stored in parts of at most :data:`PART_BYTES`, written and read one part at a
time (no call holds an archive in memory), and is only readable once complete: a write that
was cancelled or failed leaves an incomplete row, which :meth:`ArchiveStore.delete_expired`
removes with the expired ones. Archives belong to a tenant: another tenant's id is not
found. A tenant's exports are bounded (:class:`ExportQuota`: their count and bytes, checked
under a per-tenant lock in the transaction that records a new one, so concurrent exports
cannot pass it together), and an export may carry a ``reuse_key`` by which a later export
of the same records finds it (:meth:`ArchiveStore.bank_exports`). Calls block (call them
through the offload).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal, Protocol

__all__ = [
    "PART_BYTES",
    "ArchiveKind",
    "ArchiveStore",
    "ExportQuota",
    "ExportQuotaFull",
    "ExportUsage",
    "StoredArchive",
]

#: The size of a stored part.
PART_BYTES: Final = 1024 * 1024

ArchiveKind = Literal["export", "upload"]


@dataclass(frozen=True, slots=True)
class StoredArchive:
    """An archive's row: whose, what for, its size and digest, when it goes."""

    id: str
    tenant: str
    kind: ArchiveKind
    bank_id: str
    filename: str
    byte_size: int
    sha256: str
    created_at: float
    expires_at: float
    #: What an export's records and parameters digest to (``None``: not reusable).
    reuse_key: str | None = None


@dataclass(frozen=True, slots=True)
class ExportQuota:
    """The most export archives, and bytes of them, one tenant may have stored at once."""

    max_count: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ExportUsage:
    """A tenant's stored (unexpired) export archives, complete or being written: how many,
    their bytes, and when the first of them expires (``None``: none)."""

    count: int
    byte_size: int
    oldest_expires_at: float | None

    def full(self, quota: ExportQuota, adding: int = 0) -> bool:
        """Whether one more export of *adding* bytes would pass *quota* (``adding`` 0: whether
        any would: the quota is reached)."""
        return self.count + 1 > quota.max_count or self.byte_size + max(adding, 1) > (
            quota.max_bytes
        )


class ExportQuotaFull(Exception):
    """Storing an export would pass its tenant's :class:`ExportQuota` (*usage*: what the
    tenant has stored); nothing was stored."""

    def __init__(self, usage: ExportUsage, quota: ExportQuota, adding: int) -> None:
        super().__init__(f"export quota full: {usage} of {quota}, adding {adding} bytes")
        self.usage = usage
        self.quota = quota
        self.adding = adding


class ArchiveStore(Protocol):
    """Archives in parts (see the module docstring)."""

    def migrate(self) -> None:
        """Bring the schema to the current version (idempotent)."""
        ...

    def put_archive(
        self,
        archive: StoredArchive,
        parts: Iterable[bytes],
        quota: ExportQuota | None = None,
    ) -> StoredArchive:
        """Store *parts* (each at most :data:`PART_BYTES`) as *archive*, a part per
        transaction (the token checked between them), and mark it complete with its real
        size and SHA-256. Returns the stored row. With *quota* (an export), the tenant's
        stored exports and *archive*'s ``byte_size`` (its expected size) are checked
        against it when the row is recorded: :class:`ExportQuotaFull`, nothing stored."""
        ...

    def export_usage(self, tenant: str, now: float) -> ExportUsage:
        """What *tenant*'s unexpired export archives (complete or being written) hold."""
        ...

    def bank_exports(self, tenant: str, bank_id: str, now: float) -> list[StoredArchive]:
        """*tenant*'s complete, unexpired exports of bank *bank_id*, newest first."""
        ...

    def renew_archive(self, archive_id: str, expires_at: float) -> StoredArchive | None:
        """Keep the complete archive *archive_id* until *expires_at*; the renewed row, or
        ``None`` when it is gone (or expired) meanwhile."""
        ...

    def get_archive(self, tenant: str, archive_id: str) -> StoredArchive | None:
        """The complete archive *archive_id* of *tenant* (``None``: none, another tenant's,
        incomplete or expired)."""
        ...

    def archive_parts(self, archive_id: str) -> Iterator[bytes]:
        """The archive's bytes, one part per statement, in order."""
        ...

    def delete_archive(self, archive_id: str) -> bool:
        """Delete the archive (complete or not); whether there was one."""
        ...

    def delete_expired(self, now: float) -> int:
        """Delete the archives expired at *now*; how many."""
        ...
