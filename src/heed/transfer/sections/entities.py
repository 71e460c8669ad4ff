"""Section ``entities``: the entities by id (new ids on import). A name is matched case-
and space-insensitively (:func:`heed.memory.entities.canonical`), so two names equal that
way are one entity, refused twice."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field

from heed.memory.entities import canonical
from heed.transfer.ids import IdDigests
from heed.transfer.records import Id, InvalidArchive, Record, fields_of, validate
from heed.transfer.rows import EntityRow
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section, pages

__all__ = ["SECTION", "EntityRecord"]


class EntityRecord(Record):
    id: Id
    name: Annotated[str, Field(min_length=1, max_length=2000)]
    type: Annotated[str, Field(max_length=200)] | None


def encode(row: EntityRow) -> dict[str, Any]:
    return fields_of(row, EntityRecord)


def decode(value: dict[str, Any], dim: int, where: str) -> EntityRow:
    record = validate(EntityRecord, value, where)
    return EntityRow(record.id, record.name, record.type)


def read(ctx: ExportContext) -> Iterator[list[EntityRow]]:
    return ctx.snapshot().entities(ctx.batch)


def write(ctx: ImportContext) -> dict[str, int]:
    n = 0
    for page in pages(ctx.reader.rows("entities"), ctx.batch):
        n += ctx.stores.rows.write_entity_rows(
            ctx.staging.ref, [replace(e, id=ctx.ids(e.id)) for e in page]
        )
        ctx.progress.add(len(page))
    return {"entities": n}


def check(checker: Checker) -> None:
    """Unique ids and names; the ids go to :attr:`Checker.entities`."""
    entity_ids, names = checker.entities, IdDigests()
    n = 0
    for entity in checker.rows("entities"):
        n += 1
        entity_ids.add(entity.id)
        key = canonical(entity.name)
        if not key:
            raise InvalidArchive(f"entity {entity.id[:100]!r} has no name to match by")
        names.add(key)
    checker.counted("entities", n)
    checker.duplicate(entity_ids, ["entities"], lambda e: [e.id], "entity id")
    checker.duplicate(
        names, ["entities"], lambda e: [canonical(e.name)], "entity name (case and spaces aside)"
    )


SECTION = Section("entities", 1, "data", encode, decode, read, write, check)
