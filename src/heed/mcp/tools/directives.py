"""The directive tools: ``list_directives``, ``create_directive``, ``update_directive``,
``delete_directive``: a bank's standing rules for reflect and chat turns, whose fields
:class:`~heed.memory.directives.service.DirectiveService` checks."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from heed.mcp.tools.base import BankId, Limit, Name, Offset, Tags, ToolGroup
from heed.memory.directives.rules import (
    MAX_CONTENT_CHARS,
    Directive,
    DirectivePatch,
    DirectiveScope,
)
from heed.memory.directives.service import PRIORITY_RANGE
from heed.memory.models import TagsMatch

__all__ = ["Deleted", "DirectiveId", "DirectiveInfo", "DirectiveList", "DirectiveTools"]

DirectiveId = Annotated[str, Field(min_length=1, max_length=128, description="The directive's id.")]
Priority = Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])]
RuleText = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)]


class DirectiveInfo(BaseModel):
    id: str
    name: str
    content: str
    priority: int
    is_active: bool
    tags: list[str]
    created_at: str
    updated_at: str


class DirectiveList(BaseModel):
    directives: list[DirectiveInfo]
    total: int


class Deleted(BaseModel):
    id: str
    deleted: bool = True


class DirectiveTools(ToolGroup):
    """A bank's directives."""

    tool_names = ("list_directives", "create_directive", "update_directive", "delete_directive")

    async def list_directives(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        tags: Tags | None = None,
        tags_match: TagsMatch = "any",
        active_only: bool = True,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> DirectiveList:
        """List a bank's directives (standing rules that reflect and the bank's chat turns
        follow) in the order they are applied, highest priority first; with tags, only those
        that apply in that scope (the untagged ones always do)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "list_directives")
            found, total = await self.services.directives.list_directives(
                bank_id,
                DirectiveScope(tags, tags_match) if tags else None,
                active_only=active_only,
                limit=limit,
                offset=offset,
            )
        return DirectiveList(directives=[_directive(d) for d in found], total=total)

    async def create_directive(
        self,
        bank_id: BankId,
        name: Annotated[Name, Field(min_length=1, description="A label for people.")],
        content: Annotated[RuleText, Field(description="The rule, said to the model.")],
        ctx: Context[Any],
        priority: Annotated[Priority, Field(description="Higher comes first.")] = 0,
        is_active: bool = True,
        tags: Annotated[
            Tags | None,
            Field(description="Its scope: none, it always applies; else where a tag matches."),
        ] = None,
    ) -> DirectiveInfo:
        """Create a directive: a rule the bank's reflect and chat turns follow, such as
        "Answer in French."."""
        async with self._call(ctx):
            await self._allowed(bank_id, "create_directive")
            made = await self.services.directives.create(
                bank_id,
                name=name,
                content=content,
                priority=priority,
                is_active=is_active,
                tags=tags,
            )
        return _directive(made)

    async def update_directive(
        self,
        bank_id: BankId,
        directive_id: DirectiveId,
        ctx: Context[Any],
        name: Annotated[Name, Field(min_length=1)] | None = None,
        content: RuleText | None = None,
        priority: Priority | None = None,
        is_active: bool | None = None,
        tags: Tags | None = None,
    ) -> DirectiveInfo:
        """Change a directive's fields that are given (tags: [] clears its tags)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "update_directive")
            changed = await self.services.directives.update(
                bank_id,
                directive_id,
                DirectivePatch(
                    name=name, content=content, priority=priority, is_active=is_active, tags=tags
                ),
            )
        return _directive(changed)

    async def delete_directive(
        self, bank_id: BankId, directive_id: DirectiveId, ctx: Context[Any]
    ) -> Deleted:
        """Delete a directive."""
        async with self._call(ctx):
            await self._allowed(bank_id, "delete_directive")
            await self.services.directives.delete(bank_id, directive_id)
        return Deleted(id=directive_id)


def _directive(found: Directive) -> DirectiveInfo:
    return DirectiveInfo.model_validate(found, from_attributes=True)
