"""A tenant's directives, through the memory engine: create, list, read, update, delete,
and the directives a reflect or a chat turn applies (:mod:`heed.memory.directives.rules` holds
the rules; the store the rows).

Every call is tenant-scoped like the engine's (another tenant's bank, or a directive of
another bank, is a 404) and refuses bad input with a 400 naming the field before anything
is written: a blank name or content, content over :data:`MAX_CONTENT_CHARS`, a priority
outside a 32-bit integer, a blank tag, NUL anywhere, or a bank already holding
:data:`MAX_DIRECTIVES`. Store calls run in the offload; a bank another process deleted
meanwhile is a 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from heed.errors import NUL
from heed.memory.directives.rules import (
    MAX_CONTENT_CHARS,
    MAX_DIRECTIVES,
    Directive,
    DirectivePatch,
    DirectiveScope,
    select,
)
from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, InvalidInput, NotFound
from heed.runtime import run_in_thread

__all__ = [
    "MAX_NAME_CHARS",
    "PRIORITY_RANGE",
    "DirectiveService",
    "applicable_directives",
    "check_patch",
]

#: Longest directive name.
MAX_NAME_CHARS: Final = 500
#: The priorities a directive may have (a 32-bit integer, on every database).
PRIORITY_RANGE: Final = (-(2**31), 2**31 - 1)
_MAX_TAG_CHARS: Final = 256
_MAX_TAGS: Final = 64


def _check_text(value: str | None, what: str, limit: int) -> None:
    if value is None:
        return
    if NUL in value:
        raise InvalidInput(f"{what} holds a NUL character (U+0000), which heed does not store")
    if not value.strip():
        raise InvalidInput(f"{what} is empty")
    if len(value) > limit:
        raise InvalidInput(f"{what} has {len(value)} characters; the limit is {limit}")


def check_patch(patch: DirectivePatch) -> None:
    """Refuse a bad field of *patch* (a create's fields are a patch with every field)."""
    _check_text(patch.name, "name", MAX_NAME_CHARS)
    _check_text(patch.content, "content", MAX_CONTENT_CHARS)
    low, high = PRIORITY_RANGE
    if patch.priority is not None and not low <= patch.priority <= high:
        raise InvalidInput(f"priority {patch.priority} is out of range [{low}, {high}]")
    if patch.tags is not None:
        if len(patch.tags) > _MAX_TAGS:
            raise InvalidInput(f"tags has {len(patch.tags)} entries; the limit is {_MAX_TAGS}")
        for i, tag in enumerate(patch.tags):
            _check_text(tag, f"tags[{i}]", _MAX_TAG_CHARS)


async def applicable_directives(
    engine: MemoryEngine, bank: Bank, scope: DirectiveScope
) -> list[Directive]:
    """The active directives of *bank* that apply in *scope*, in the order they are said
    (:func:`heed.memory.directives.rules.select`). Reflect and chat turns call this."""
    return select(await run_in_thread(engine.store.list_directives, bank.ref), scope)


class DirectiveService:
    """The directives of the current tenant's banks (see the module docstring)."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine

    async def create(
        self,
        bank_id: str,
        *,
        name: str,
        content: str,
        priority: int = 0,
        is_active: bool = True,
        tags: Sequence[str] | None = None,
    ) -> Directive:
        """A new directive of the bank (400 when the bank holds :data:`MAX_DIRECTIVES`)."""
        tag_list = list(dict.fromkeys(tags or ()))
        check_patch(DirectivePatch(name, content, priority, is_active, tag_list))
        bank = await self.engine.get_bank(bank_id)
        directive = Directive(
            id=str(uuid.uuid4()),
            bank_ref=bank.ref,
            name=name,
            content=content,
            priority=priority,
            is_active=is_active,
            tags=tag_list,
        )
        async with self.engine.bank_gone_is_not_found(bank):
            made = await run_in_thread(
                self.engine.store.create_directive, directive, MAX_DIRECTIVES
            )
        if made is None:
            raise InvalidInput(
                f"bank {bank_id!r} holds {MAX_DIRECTIVES} directives, the most a bank may "
                "hold; delete one first"
            )
        return made

    async def list_directives(
        self,
        bank_id: str,
        scope: DirectiveScope | None,
        *,
        active_only: bool = True,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[Directive], int]:
        """A page of the bank's directives in order (only those that apply in *scope*, when
        given; only active ones with *active_only*), and how many there are."""
        bank = await self.engine.get_bank(bank_id)
        stored = await run_in_thread(self.engine.store.list_directives, bank.ref)
        found = select(stored, scope or DirectiveScope(apply_all=True), active_only=active_only)
        return found[offset : offset + limit], len(found)

    async def get(self, bank_id: str, directive_id: str) -> Directive:
        """The bank's directive *directive_id* (404 naming it)."""
        bank = await self.engine.get_bank(bank_id)
        found = await run_in_thread(self.engine.store.get_directive, bank.ref, directive_id)
        if found is None:
            raise NotFound(f"directive {directive_id!r} not found in bank {bank_id!r}")
        return found

    async def update(self, bank_id: str, directive_id: str, patch: DirectivePatch) -> Directive:
        """Change the sent fields of the bank's directive (404 naming it)."""
        if patch.tags is not None:
            patch = replace(patch, tags=list(dict.fromkeys(patch.tags)))
        check_patch(patch)
        bank = await self.engine.get_bank(bank_id)
        async with self.engine.bank_gone_is_not_found(bank):
            found = await run_in_thread(
                self.engine.store.update_directive, bank.ref, directive_id, patch
            )
        if found is None:
            raise NotFound(f"directive {directive_id!r} not found in bank {bank_id!r}")
        return found

    async def delete(self, bank_id: str, directive_id: str) -> None:
        """Delete the bank's directive (404 naming it)."""
        bank = await self.engine.get_bank(bank_id)
        if not await run_in_thread(self.engine.store.delete_directive, bank.ref, directive_id):
            raise NotFound(f"directive {directive_id!r} not found in bank {bank_id!r}")

    async def for_turn(self, tenant: str, bank_id: str) -> list[Directive]:
        """The directives a chat turn of a session bound to *bank_id* applies: the bank's
        active global ones (a turn asks in no tag scope)."""
        bank = await self.engine.get_bank(bank_id, tenant=tenant)
        return await applicable_directives(self.engine, bank, DirectiveScope())
