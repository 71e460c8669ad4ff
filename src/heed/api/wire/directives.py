"""Wire models of a bank's directives (``/v1/default/banks/{bank_id}/directives``), shaped
like hindsight-client's ``CreateDirectiveRequest``, ``UpdateDirectiveRequest``,
``DirectiveResponse`` and ``DirectiveListResponse``.

The request models name every field the client sends; any other field is refused (422
naming it), never ignored. In an update a ``null`` field (the client sends every field it
was not given as ``null``) keeps the stored value; ``tags: []`` clears the tags. The rules
beyond JSON types (a blank name, the per-bank count) are the domain's
(:mod:`heed.memory.directives.service`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from heed.api.input_rules import JSON_INTEGER, Name, RequestBody, TagList
from heed.memory.directives.rules import MAX_CONTENT_CHARS, Directive
from heed.memory.directives.service import PRIORITY_RANGE

__all__ = [
    "DirectiveCreate",
    "DirectiveListResponse",
    "DirectiveResponse",
    "DirectiveUpdate",
    "directive_response",
]

Content = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)]
Priority = Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1]), JSON_INTEGER]


class _Body(RequestBody):
    model_config = ConfigDict(strict=True, extra="forbid")


class DirectiveCreate(_Body):
    name: Annotated[Name, Field(min_length=1)] = Field(
        description="A label for people (not said to the model)."
    )
    content: Content = Field(description="The rule, said in reflect's and chat turns' prompts.")
    priority: Priority = Field(default=0, description="Higher priority directives come first.")
    is_active: bool = True
    tags: TagList | None = Field(
        default=None,
        description="The directive's scope: none, it always applies; else only to a reflect "
        "whose tags match (or with apply_all_directives).",
    )


class DirectiveUpdate(_Body):
    name: Annotated[Name, Field(min_length=1)] | None = None
    content: Content | None = None
    priority: Priority | None = None
    is_active: bool | None = None
    tags: TagList | None = None


class DirectiveResponse(BaseModel):
    id: str
    bank_id: str
    name: str
    content: str
    priority: int = 0
    is_active: bool = True
    tags: list[str] | None = None
    created_at: str | None = None
    updated_at: str | None = None


class DirectiveListResponse(BaseModel):
    items: list[DirectiveResponse]
    total: int = Field(description="Directives matching the filter (not just this page).")
    limit: int
    offset: int


def directive_response(bank_id: str, directive: Directive) -> DirectiveResponse:
    return DirectiveResponse.model_validate({**asdict(directive), "bank_id": bank_id})
