"""The two stores a bank transfer uses: the bank's rows (:class:`TransferStore`) and the
archives (:class:`ArchiveStore`).

:class:`TransferStore`: a whole bank read and written as rows (:mod:`heed.transfer.rows`);
:class:`heed.storage.memory.SqlMemoryStore` implements it beside the memory store
(:mod:`heed.storage.transfer.rows`).

:class:`ArchiveStore`: where bank archives wait: an export's result until it is downloaded,
an upload until its
import has run. :class:`heed.storage.transfer.archives.SqlArchiveStore` implements
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

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Final, Literal, Protocol

from heed.memory.models import Bank
from heed.runtime import raise_if_cancelled
from heed.transfer.rows import (
    BankReader,
    BankSelection,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    UnitRow,
)

__all__ = [
    "PART_BYTES",
    "ArchiveKind",
    "ArchiveStore",
    "ExportQuota",
    "ExportQuotaFull",
    "ExportUsage",
    "StoredArchive",
    "TransferStore",
    "file_parts",
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


class TransferStore(Protocol):
    """A whole bank read and written as rows, in bounded batches, for bank transfers
    (:mod:`heed.transfer.service`; the rows: :mod:`heed.transfer.rows`). The SQL memory
    store implements it; a transfer is given it typed so. The writes are meant for a bank
    nobody else sees yet (a staging bank, published whole by :meth:`publish_bank`,
    discarded on failure): each ``write_*`` call is one transaction under the bank's lock
    that checks the bank's row first (:class:`~heed.memory.store.BankGone`, nothing
    written) and writes everything it was given or nothing, except
    :meth:`write_document_rows` and :meth:`write_unit_rows`, which commit a few memories
    at a time (a cancel waits for one such transaction, never for a document; on
    PostgreSQL, several connections at once, whose running statements a cancel stops)."""

    def read_bank(
        self, bank_ref: str, selection: BankSelection
    ) -> AbstractContextManager[BankReader]:
        """A reader of the bank's rows (*selection* of them) from one consistent
        snapshot: writes committed after it opened are not seen. Use it in one thread."""
        ...

    def write_document_rows(
        self, bank_ref: str, document: DocumentRow, units: Iterable[Sequence[UnitRow]]
    ) -> int:
        """Write a document that the bank does not hold (``ValueError`` when it does), its
        chunks and its ``unit_count`` units, given in batches (in seq order; read as they
        are written): the units get consecutive seqs. The document's row, chunks and
        reserved seqs are one transaction, then each batch is one (the token checked
        between them): a failure or a cancel part-way leaves part of the document, for the
        caller to discard with its bank. ``ValueError`` when the units are not
        ``unit_count`` or name another document, or a vector has another size than the
        store holds. Returns the units written."""
        ...

    def write_unit_rows(self, bank_ref: str, units: Sequence[UnitRow]) -> int:
        """Write units without a document (observations; ``ValueError`` for a document's
        unit, before anything is written), a few per transaction. Returns how many."""
        ...

    def write_entity_rows(self, bank_ref: str, entities: Sequence[EntityRow]) -> int:
        """Write entities (canonical names derived from their names; ids and canonical
        names must be new). Returns how many."""
        ...

    def write_membership_rows(self, bank_ref: str, memberships: Sequence[MembershipRow]) -> int:
        """Write entity rows between the bank's units and entities (by id; ``ValueError``
        naming one the bank does not hold). Returns how many were new."""
        ...

    def write_link_rows(self, bank_ref: str, links: Sequence[LinkRow]) -> int:
        """Write links between the bank's units (by id; ``ValueError`` naming one the bank
        does not hold). Returns how many were new."""
        ...

    def delete_bank_in_batches(self, bank_ref: str, batch: int) -> int:
        """Delete the bank and everything in it as
        :meth:`~heed.memory.store.MemoryStore.delete_bank` does, but its units in
        transactions of at most *batch* (the writer is free between them): for a bank
        nobody sees (a staging bank), whose part-deleted state nobody reads. Returns how
        many units it held."""
        ...

    def publish_bank(self, bank: Bank) -> Bank:
        """Give the bank of ``bank.ref`` its ``tenant``, ``bank_id`` and profile (name,
        mission, background, disposition, config) in one statement: how a bank written
        under a hidden name appears whole. :class:`~heed.memory.store.BankTaken` when
        another bank holds that id, :class:`~heed.memory.store.BankGone` when the ref is gone."""
        ...


def file_parts(source: IO[bytes]) -> Iterator[bytes]:
    """*source* read in parts of :data:`PART_BYTES` (the token checked between them)."""
    while part := source.read(PART_BYTES):
        raise_if_cancelled()
        yield part
