"""Section ``unit_entities``: which memory names which entity (both of this archive)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from heed.transfer.records import Id, Record, fields_of, validate
from heed.transfer.rows import MembershipRow
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section, pages

__all__ = ["SECTION", "MembershipRecord"]


class MembershipRecord(Record):
    unit_id: Id
    entity_id: Id


def encode(row: MembershipRow) -> dict[str, Any]:
    return fields_of(row, MembershipRecord)


def decode(value: dict[str, Any], dim: int, where: str) -> MembershipRow:
    record = validate(MembershipRecord, value, where)
    return MembershipRow(record.unit_id, record.entity_id)


def read(ctx: ExportContext) -> Iterator[list[MembershipRow]]:
    return ctx.snapshot().memberships(ctx.batch)


def write(ctx: ImportContext) -> dict[str, int]:
    ids, n = ctx.ids, 0
    for page in pages(ctx.reader.rows("unit_entities"), ctx.batch):
        n += ctx.stores.rows.write_membership_rows(
            ctx.staging.ref, [MembershipRow(ids(m.unit_id), ids(m.entity_id)) for m in page]
        )
        ctx.progress.add(len(page))
    return {"unit_entities": n}


def check(checker: Checker) -> None:
    checker.references(
        "unit_entities",
        lambda row: ((row.unit_id, "memory"), (row.entity_id, "entity")),
        {"memory": checker.memories, "entity": checker.entities},
        "an entity row names {what} {value}",
    )


SECTION = Section("unit_entities", 1, "data", encode, decode, read, write, check)
