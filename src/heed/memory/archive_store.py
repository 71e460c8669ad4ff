"""Where bank archives wait: an export's result until it is downloaded, an upload until its
import has run. :class:`heed.storage.archive_store.SqlArchiveStore` implements
:class:`ArchiveStore` in the server's database (SQLite or PostgreSQL), so any process
sharing that database serves any archive: a download may reach another instance than the
export, an import may run on another instance than the upload.

An archive is stored in parts of at most :data:`PART_BYTES`, written and read one part at a
time (no call holds an archive in memory), and is only readable once complete: a write that
was cancelled or failed leaves an incomplete row, which :meth:`ArchiveStore.delete_expired`
removes with the expired ones. Archives belong to a tenant: another tenant's id is not
found. Calls block (call them through the offload).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal, Protocol

__all__ = ["PART_BYTES", "ArchiveKind", "ArchiveStore", "StoredArchive"]

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


class ArchiveStore(Protocol):
    """Archives in parts (see the module docstring)."""

    def migrate(self) -> None:
        """Bring the schema to the current version (idempotent)."""
        ...

    def put_archive(self, archive: StoredArchive, parts: Iterable[bytes]) -> StoredArchive:
        """Store *parts* (each at most :data:`PART_BYTES`) as *archive*, a part per
        transaction (the token checked between them), and mark it complete with its real
        size and SHA-256. Returns the stored row."""
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
