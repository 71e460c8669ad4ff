"""The blocking halves of a bank transfer (:mod:`heed.transfer.service` runs them in the
offload): a bank into an archive (:func:`write_archive`), an archive into a staging bank
(:func:`import_archive`), an archive's documents into a bank (:func:`merge_archive`).

The first two walk the sections' registry (:mod:`heed.transfer.sections`): each section
of the transfer's groups reads its rows from the bank into the archive's container
(:mod:`heed.transfer.archive`), or writes them from it into the staging bank, a page at a
time, the token checked between pages; progress goes to a
:class:`~heed.transfer.sections.base.Progress`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import IO, Final, Literal

from heed.memory.models import Bank, Chunk, EntityRef, PreparedDocument, PreparedUnit
from heed.runtime import raise_if_cancelled
from heed.transfer.archive import ArchiveLimits, ArchiveReader, ArchiveWriter
from heed.transfer.check import check_embedder
from heed.transfer.ids import NewIds
from heed.transfer.rows import BankSelection, DocumentRow, UnitRow
from heed.transfer.sections import REGISTRY
from heed.transfer.sections.base import (
    ExportContext,
    Flags,
    ImportContext,
    Progress,
    TransferStores,
    exported,
    imported,
)
from heed.transfer.sections.units import when

__all__ = ["CONFLICTS", "import_archive", "merge_archive", "write_archive"]

#: What a merge does with a document whose id the bank holds: leave the bank's (``skip``),
#: put the archive's in its place (``replace``), or keep both, the archive's under a new id
#: (``new-id``).
CONFLICTS: Final = ("skip", "replace", "new-id")


def write_archive(
    stores: TransferStores,
    target: IO[bytes],
    bank: Bank,
    selection: BankSelection,
    flags: Flags,
    scope: Literal["bank", "documents"],
    progress: Progress,
    *,
    model: str,
    dim: int,
    batch: int,
    compress: bool = True,
    content: Callable[[bytes], object] | None = None,
) -> dict[str, int]:
    """Write *bank* (its *selection*) as an archive into *target*: every section the
    *scope* and *flags* export, in order; the records per section. *content* is fed the
    records' bytes (:class:`ArchiveWriter`). Blocking; checks the token between pages."""
    writer = ArchiveWriter(
        target,
        scope=scope,
        source_bank_id=bank.bank_id,
        embedding_model=model,
        dim=dim,
        compress=compress,
        content=content,
    )
    ctx = ExportContext(bank, selection, flags, scope, stores, batch, progress)
    try:
        with ctx.exits:  # the bank's snapshot, once a data section opened it
            for section in REGISTRY:
                if exported(section.group, scope, flags):
                    for page in section.read(ctx):
                        writer.write(section.name, page)
        manifest = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return {name: manifest.records(name) for name in manifest.sections if name != "bank"}


def import_archive(
    stores: TransferStores,
    archive: IO[bytes],
    staging: Bank,
    target: Bank,
    flags: Flags,
    progress: Progress,
    *,
    limits: ArchiveLimits,
    model: str,
    dim: int,
    batch: int,
) -> dict[str, int]:
    """Write *archive* into the bank *staging*, and give *target* (the bank to publish)
    the archive's profile and settings: every section the *flags* import, in order; the
    rows written per section. Webhooks are staged as *target*'s under the staging bank's
    ref (it keeps it when published); a failed import discards them with the staging
    bank. Progress counts the data sections' records. Blocking; checks the token between
    batches."""
    counts: dict[str, int] = {}
    with ArchiveReader(archive, limits) as reader:
        check_embedder(reader.manifest, model, dim)
        ctx = ImportContext(
            reader,
            reader.bank(),
            staging,
            target,
            flags,
            NewIds(staging.ref),
            stores,
            batch,
            progress,
        )
        started = False
        for section in REGISTRY:
            if not imported(section.group, flags):
                continue
            if section.group == "data" and not started:
                data = (s.name for s in REGISTRY if s.group == "data")
                progress.start("import", sum(reader.manifest.records(name) for name in data))
                started = True
            counts |= section.write(ctx)
    raise_if_cancelled()
    return counts


# -- merge ------------------------------------------------------------------------------------


def _archive_graph(
    reader: ArchiveReader,
) -> tuple[dict[str, list[EntityRef]], dict[str, list[str]]]:
    """What a merge needs of the archive's graph: each memory's entities (by name, to be
    resolved against the bank's), and each memory's causal partners (a fact that caused
    another)."""
    entities = {e.id: EntityRef(e.name, e.type) for e in reader.rows("entities")}
    named: dict[str, list[EntityRef]] = {}
    for row in reader.rows("unit_entities"):
        named.setdefault(row.unit_id, []).append(entities[row.entity_id])
    causes: dict[str, list[str]] = {}
    for link in reader.rows("links"):
        if link.link_type == "causal":
            causes.setdefault(link.from_id, []).append(link.to_id)
    return named, causes


def _prepared(
    document: DocumentRow,
    units: list[UnitRow],
    document_id: str,
    conflict: str,
    ids: NewIds,
    named: dict[str, list[EntityRef]],
    causes: dict[str, list[str]],
) -> PreparedDocument:
    """An archive's document as a retain writes one: new ids, chunks by index, entities by
    name, provenance and causes within the document."""
    chunk_index = {c.id: c.chunk_index for c in document.chunks}
    position = {u.id: i for i, u in enumerate(units)}
    prepared = [
        PreparedUnit(
            id=ids(u.id),
            text=u.text,
            index_text=u.index_text if u.index_text is not None else u.text,
            fact_type=u.fact_type,
            context=u.context,
            chunk_index=chunk_index.get(u.chunk_id, -1) if u.chunk_id is not None else -1,
            occurred_start=when(u.occurred_start),
            occurred_end=when(u.occurred_end),
            mentioned_at=when(u.mentioned_at),
            metadata=dict(u.metadata),
            tags=list(u.tags),
            entities=named.get(u.id, []),
            embedding=u.vector,
            token_count=u.token_count,
            source_ids=[ids(i) for i in u.source_ids if i in position],
            caused_by=[  # one way: the links are written both ways
                ids(i) for i in causes.get(u.id, []) if position.get(i, len(units)) < position[u.id]
            ],
        )
        for u in units
    ]
    return PreparedDocument(
        document_id=document_id,
        replace=conflict == "replace",
        original_text=document.original_text,
        metadata=dict(document.metadata),
        tags=list(document.tags),
        chunks=[Chunk(ids(c.id), c.chunk_index, c.text) for c in document.chunks],
        units=prepared,
    )


def merge_archive(
    archive: IO[bytes],
    conflict: str,
    ids: NewIds,
    progress: Progress,
    *,
    limits: ArchiveLimits,
    held: Callable[[str], bool],
    write: Callable[[PreparedDocument], None],
    model: str,
    dim: int,
) -> dict[str, int]:
    """Fold the archive's documents into a bank (see :mod:`heed.transfer.service`): each
    document is written whole by *write* (a retain's write: one transaction, entities
    resolved against the bank's by name, links made as a retain makes them), or skipped,
    or renamed, by *conflict* when *held* says the bank holds its id. Observations, the
    bank's settings and its knowledge are not merged. Blocking; checks the token between
    documents (and *write* inside one)."""
    counts = {"documents": 0, "units": 0, "skipped": 0, "renamed": 0, "replaced": 0}
    with ArchiveReader(archive, limits) as reader:
        check_embedder(reader.manifest, model, dim)
        named, causes = _archive_graph(reader)
        progress.start("merge", reader.manifest.records("documents"))
        units = reader.rows("units")
        for document in reader.rows("documents"):
            raise_if_cancelled()
            mine: list[UnitRow] = list(itertools.islice(units, document.unit_count))
            document_id = document.document_id
            if held(document_id):
                if conflict == "skip":
                    counts["skipped"] += 1
                    progress.add(1)
                    continue
                if conflict == "new-id":
                    document_id = _free_id(document_id, ids, held)
                    counts["renamed"] += 1
                else:
                    counts["replaced"] += 1
            write(_prepared(document, mine, document_id, conflict, ids, named, causes))
            counts["documents"] += 1
            counts["units"] += len(mine)
            progress.add(1)
        counts["observations_not_merged"] = reader.manifest.records("observations")
    return counts


def _free_id(document_id: str, ids: NewIds, held: Callable[[str], bool]) -> str:
    """A new id for an archive's document whose id the bank holds: its id and a suffix of
    this merge's (a second suffix if even that is held)."""
    candidate = f"{document_id}-{ids(document_id)[:8]}"
    n = 2
    while held(candidate):
        candidate = f"{document_id}-{ids(document_id)[:8]}-{n}"
        n += 1
    return candidate
