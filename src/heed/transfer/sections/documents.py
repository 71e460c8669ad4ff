"""Section ``documents``: the retained documents by ``document_id`` (kept: the bank's own),
each with its chunks, the retained items (new ids on import). A document's memories
follow it in ``units``: this module checks and writes the two in step."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from heed.transfer.ids import IdDigests
from heed.transfer.records import (
    Count,
    Id,
    InvalidArchive,
    Record,
    Tags,
    fields_of,
    row_of,
    validate,
)
from heed.transfer.rows import ChunkRow, DocumentRow, UnitRow
from heed.transfer.sections.base import (
    IMPORT_BATCH,
    Checker,
    ExportContext,
    ImportContext,
    Progress,
    Section,
    pages,
)

__all__ = ["SECTION", "DocumentRecord"]


class ChunkRecord(Record):
    id: Id
    chunk_index: Count
    text: str


class DocumentRecord(Record):
    document_id: Id
    original_text: str
    content_hash: str | None
    metadata: dict[str, Any]
    tags: Tags
    created_at: str
    updated_at: str
    unit_count: Count
    chunks: list[ChunkRecord]


def encode(row: DocumentRow) -> dict[str, Any]:
    return {
        **fields_of(row, DocumentRecord),
        "chunks": [fields_of(chunk, ChunkRecord) for chunk in row.chunks],
    }


def decode(value: dict[str, Any], dim: int, where: str) -> DocumentRow:
    record = validate(DocumentRecord, value, where)
    chunks = [ChunkRow(c.id, c.chunk_index, c.text) for c in record.chunks]
    return row_of(record, DocumentRow, where, chunks=chunks)


def read(ctx: ExportContext) -> Iterator[list[DocumentRow]]:
    return ctx.snapshot().documents(max(1, ctx.batch // 8))


def _counted(units: Iterator[list[UnitRow]], progress: Progress) -> Iterator[list[UnitRow]]:
    for page in units:
        yield page
        progress.add(len(page))


def write(ctx: ImportContext) -> dict[str, int]:
    """Each document with its chunks and its ``unit_count`` memories (read from ``units``
    as they are written), new ids given."""
    ids, rows = ctx.ids, ctx.stores.rows
    units = ctx.reader.rows("units")
    counts = {"documents": 0, "units": 0}
    for document in ctx.reader.rows("documents"):
        assert isinstance(document, DocumentRow)
        document.chunks = [replace(c, id=ids(c.id)) for c in document.chunks]
        mine = (ids.unit(u) for u in itertools.islice(units, document.unit_count))
        batches = _counted(pages(mine, IMPORT_BATCH), ctx.progress)
        counts["units"] += rows.write_document_rows(ctx.staging.ref, document, batches)
        counts["documents"] += 1
        ctx.progress.add(1)
    if next(units, None) is not None:
        raise InvalidArchive("the units section holds memories of no document")
    return counts


def check(checker: Checker) -> None:
    """Documents and their units, in step: a document's units follow it, in its order;
    the units' ids go to :attr:`Checker.memories`."""
    documents = checker.rows("documents")
    unit_ids, document_ids, chunk_ids = checker.memories, IdDigests(), IdDigests()
    current: DocumentRow | None = None
    own_chunks: set[str] = set()
    left = n_documents = n_units = 0
    for unit in checker.rows("units"):
        assert isinstance(unit, UnitRow)
        where = f"unit {unit.id[:100]!r}"
        while left == 0:
            current = next(documents, None)
            if current is None:
                raise InvalidArchive(f"{where} follows the last document's memories")
            n_documents += 1
            own_chunks = _add_document(current, document_ids, chunk_ids)
            left = current.unit_count
        assert current is not None
        if unit.document_id != current.document_id:
            raise InvalidArchive(
                f"{where} names document {unit.document_id!r} where document "
                f"{current.document_id!r}'s memories are ({left} left)"
            )
        if unit.chunk_id is not None and unit.chunk_id not in own_chunks:
            raise InvalidArchive(f"{where} names chunk {unit.chunk_id!r} of no document of its")
        unit_ids.add(unit.id)
        left -= 1
        n_units += 1
    if left:
        assert current is not None
        raise InvalidArchive(
            f"document {current.document_id!r} declares {current.unit_count} memories; "
            f"the units section ends {left} short"
        )
    for document in documents:
        n_documents += 1
        _add_document(document, document_ids, chunk_ids)
        if document.unit_count:
            raise InvalidArchive(
                f"document {document.document_id!r} declares {document.unit_count} "
                "memories; the units section has none left for it"
            )
    checker.counted("documents", n_documents)
    checker.counted("units", n_units)
    checker.duplicate(document_ids, ["documents"], lambda d: [d.document_id], "document id")
    checker.duplicate(chunk_ids, ["documents"], lambda d: [c.id for c in d.chunks], "chunk id")


def _add_document(document: DocumentRow, ids: IdDigests, chunk_ids: IdDigests) -> set[str]:
    """Add *document*'s id and its chunks' ids; its own chunk ids (for its units)."""
    ids.add(document.document_id)
    own: set[str] = set()
    for chunk in document.chunks:
        chunk_ids.add(chunk.id)
        own.add(chunk.id)
    return own


SECTION = Section("documents", 1, "data", encode, decode, read, write, check)
