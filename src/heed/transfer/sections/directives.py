"""Section ``directives``: the bank's rules (at most
:data:`~heed.memory.directives.rules.MAX_DIRECTIVES`), with its settings. An import gives
each a new id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from pydantic import Field

from heed.memory.directives.rules import MAX_CONTENT_CHARS, MAX_DIRECTIVES, Directive
from heed.transfer.records import (
    NOT_BLANK,
    Id,
    InvalidArchive,
    Name,
    Record,
    ScopeTags,
    codec,
)
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section

__all__ = ["SECTION", "DirectiveRecord"]


class DirectiveRecord(Record):
    """A rule of the bank, by the directive service's limits."""

    id: Id
    name: Name
    content: Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, pattern=NOT_BLANK)]
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
    is_active: bool
    tags: ScopeTags
    created_at: str
    updated_at: str


encode, decode = codec(DirectiveRecord, Directive, bank_ref="")


def read(ctx: ExportContext) -> Iterator[list[Directive]]:
    yield ctx.stores.memory.list_directives(ctx.bank.ref)


def write(ctx: ImportContext) -> dict[str, int]:
    if ctx.record is None:  # a documents archive: no bank, no rules
        return {}
    n = 0
    for directive in ctx.reader.rows("directives"):
        directive.id, directive.bank_ref = ctx.ids(directive.id), ctx.staging.ref
        if ctx.stores.memory.create_directive(directive, MAX_DIRECTIVES) is None:
            raise InvalidArchive(f"more than {MAX_DIRECTIVES} directives")
        n += 1
    return {"directives": n}


def check(checker: Checker) -> None:
    checker.unique("directives", MAX_DIRECTIVES, "directives; a bank holds at most")


SECTION = Section("directives", 1, "config", encode, decode, read, write, check)
