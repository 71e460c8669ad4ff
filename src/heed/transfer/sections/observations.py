"""Section ``observations``: consolidation's observations (memories of no document or
chunk), oldest first, in the record of ``units`` (:mod:`heed.transfer.sections.units`).
Their ids share one space with the documents' memories."""

from __future__ import annotations

from collections.abc import Iterator

from heed.transfer.records import InvalidArchive
from heed.transfer.rows import UnitRow
from heed.transfer.sections import units
from heed.transfer.sections.base import (
    IMPORT_BATCH,
    Checker,
    ExportContext,
    ImportContext,
    Section,
    pages,
)

__all__ = ["SECTION"]


def read(ctx: ExportContext) -> Iterator[list[UnitRow]]:
    for page in units.with_index_texts(ctx.snapshot().observations(ctx.batch), ctx.batch):
        yield page
        ctx.progress.add(len(page))


def write(ctx: ImportContext) -> dict[str, int]:
    n = 0
    for page in pages(ctx.reader.rows("observations"), IMPORT_BATCH):
        n += ctx.stores.rows.write_unit_rows(ctx.staging.ref, [ctx.ids.unit(u) for u in page])
        ctx.progress.add(len(page))
    return {"observations": n}


def check(checker: Checker) -> None:
    n = 0
    for unit in checker.rows("observations"):
        n += 1
        if unit.document_id is not None or unit.chunk_id is not None:
            raise InvalidArchive(f"observation {unit.id[:100]!r} names a document or chunk")
        checker.memories.add(unit.id)
    checker.counted("observations", n)
    checker.duplicate(checker.memories, ["units", "observations"], lambda u: [u.id], "memory id")


SECTION = Section("observations", 1, "data", units.encode, units.decode, read, write, check)
