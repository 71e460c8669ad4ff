"""The whole check of an uploaded bank archive, in memory that does not follow its size.

:class:`~heed.transfer.archive.ArchiveReader` checks the container and each section's
module one record at a time; :func:`check_archive` reads every record once more and has
each section check what spans records (:meth:`heed.transfer.sections.base.Section.check`,
in the registry's order): unique ids (memories, documents, chunks, entities, entity names,
directives, webhooks, knowledge-base nodes), a document's units following it in order and
in number, chunks, entities and memories referenced where they exist, record counts as the
manifest declares, the knowledge base's tree.

**Memory.** A hostile archive may hold millions of long ids: keeping them as Python strings
took hundreds of megabytes that were not returned after the 400. Here an id is kept as an
8-byte digest (BLAKE2b keyed with a random key per check, so an archive cannot be crafted
to collide) in a packed array (:class:`~heed.transfer.ids.IdDigests`), duplicates are
found by sorting, and references are looked up in the sorted digests in batches. The
mental models and folders (at most :data:`~heed.mental_models.values.MAX_MENTAL_MODELS` each) are
kept as their tree
fields only, never whole. So a check holds, whatever the archive declares or holds:

- 8 bytes per id-bearing record (at most :attr:`ArchiveLimits.max_records` records in all),
- one record at a time (:attr:`ArchiveLimits.max_record_bytes` bytes, and at most
  :attr:`ArchiveLimits.max_record_values` JSON values, checked before it is decoded),
- the current document's chunk ids, a batch of references, the tree of the knowledge base.

Every refusal is an :class:`~heed.transfer.records.InvalidArchive` (400) naming the
problem; a duplicate id is named by reading its section again (only on that refusal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from heed.runtime import ChildFd
from heed.transfer.archive import ArchiveLimits, ArchiveReader, Manifest
from heed.transfer.records import InvalidArchive
from heed.transfer.sections import REGISTRY
from heed.transfer.sections.bank import BankRecord
from heed.transfer.sections.base import Checker
from heed.webhooks.models import Webhook

__all__ = ["ArchiveCheck", "check_archive", "check_archive_file", "check_embedder"]


@dataclass(slots=True)
class ArchiveCheck:
    """What :func:`check_archive` read: the manifest and the records per section."""

    manifest: Manifest
    bank: BankRecord | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(self.counts.values())


def check_embedder(manifest: Manifest, model: str, dim: int) -> None:
    """Refuse an archive whose vectors another embedder made (they are imported as they
    are)."""
    if (manifest.embedding_model, manifest.dim) != (model, dim):
        raise InvalidArchive(
            f"its vectors were made by {manifest.embedding_model!r} ({manifest.dim} "
            f"dimensions); this server embeds with {model!r} ({dim} dimensions), "
            "and heed imports vectors without embedding again"
        )


def check_archive_file(
    fd: ChildFd, limits: ArchiveLimits, model: str, dim: int, with_webhooks: bool
) -> tuple[ArchiveCheck, list[Webhook]]:
    """The whole check of the archive open as *fd* (handed to a child process: see
    :meth:`heed.transfer.service.BankTransfers.check_upload`), that this server's embedder
    made its vectors, and its webhooks (when *with_webhooks*) for the caller to check by
    the webhook service's rules. Blocking; raises :class:`InvalidArchive`."""
    with os.fdopen(fd.fd, "rb") as archive:
        archive.seek(0)
        with ArchiveReader(archive, limits) as reader:
            check_embedder(reader.manifest, model, dim)
            check = check_archive(reader)
            webhooks = list(reader.rows("webhooks")) if with_webhooks else []
    return check, webhooks


def check_archive(reader: ArchiveReader) -> ArchiveCheck:
    """Read every record of the archive once and check what spans records (see the module
    docstring); raises :class:`InvalidArchive` naming the first problem. Blocking; checks
    the token (every few records, and between batches of references)."""
    result = ArchiveCheck(reader.manifest, reader.bank())
    checker = Checker(reader)
    for section in REGISTRY:
        section.check(checker)
    result.counts = checker.counts
    return result
