"""Section ``links``: graph links between the archive's memories (``entity``,
``temporal``, ``source``, ``causal``), with a finite weight."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated, Any, Final

from pydantic import Field

from heed.transfer.records import Id, InvalidArchive, Record, fields_of, validate
from heed.transfer.rows import LinkRow
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section, pages

__all__ = ["SECTION", "LinkRecord"]

#: Longest link type (``entity``, ``temporal``, ``source``, ``causal`` today).
LINK_TYPE: Final = re.compile(r"^[a-z][a-z_]{0,31}$")


class LinkRecord(Record):
    from_id: Id
    to_id: Id
    link_type: Annotated[str, Field(pattern=LINK_TYPE.pattern)]
    weight: float


def encode(row: LinkRow) -> dict[str, Any]:
    return fields_of(row, LinkRecord)


def decode(value: dict[str, Any], dim: int, where: str) -> LinkRow:
    record = validate(LinkRecord, value, where)
    if not math.isfinite(record.weight):
        raise InvalidArchive(f"{where}: weight is not finite")
    return LinkRow(record.from_id, record.to_id, record.link_type, record.weight)


def read(ctx: ExportContext) -> Iterator[list[LinkRow]]:
    return ctx.snapshot().links(ctx.batch)


def write(ctx: ImportContext) -> dict[str, int]:
    ids, n = ctx.ids, 0
    for page in pages(ctx.reader.rows("links"), ctx.batch):
        moved = [replace(k, from_id=ids(k.from_id), to_id=ids(k.to_id)) for k in page]
        n += ctx.stores.rows.write_link_rows(ctx.staging.ref, moved)
        ctx.progress.add(len(page))
    return {"links": n}


def check(checker: Checker) -> None:
    checker.references(
        "links",
        lambda row: ((row.from_id, "memory"), (row.to_id, "memory")),
        {"memory": checker.memories},
        "a link names {what} {value}, which is not here",
    )


SECTION = Section("links", 1, "data", encode, decode, read, write, check)
