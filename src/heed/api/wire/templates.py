"""Bank templates' JSON, shaped like Hindsight's ``BankTemplateManifest`` (what
:mod:`heed.templates` exports and imports). The ``bank`` part is checked by the bank
settings' rules (a key heed does not take is a 400 naming it), a trigger by the mental
models' rules, so this shape stays the same as the client's."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field

from heed.api.input_rules import MAX_LIST_ITEMS, Name, RequestBody, TagList, Text
from heed.api.wire.directives import Content, Priority
from heed.api.wire.mental_models import ContentBudget, TriggerIn
from heed.templates import (
    CURRENT_VERSION,
    ImportSummary,
    Template,
    TemplateDirective,
    TemplateModel,
)

__all__ = [
    "BankTemplateDirective",
    "BankTemplateImportResponse",
    "BankTemplateManifest",
    "BankTemplateMentalModel",
    "import_response",
    "manifest_of",
]


T = TypeVar("T")
_Listed = Annotated[list[T], Field(max_length=MAX_LIST_ITEMS)]


class BankTemplateMentalModel(RequestBody):
    id: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="The model's id: lowercase letters, digits and hyphens (matched on import)"
    )
    name: Annotated[Name, Field(min_length=1)]
    source_query: Annotated[Text, Field(min_length=1)]
    tags: TagList = Field(default_factory=list)
    max_tokens: ContentBudget | None = None
    trigger: TriggerIn | None = None


class BankTemplateDirective(RequestBody):
    name: Annotated[Name, Field(min_length=1)] = Field(description="Matched by name on import")
    content: Content
    priority: Priority = 0
    is_active: bool = True
    tags: TagList = Field(default_factory=list)


class BankTemplateManifest(RequestBody):
    """A bank's setup: its own settings, mental models and directives (no memories)."""

    version: str = Field(description=f"The manifest's version (this server: {CURRENT_VERSION!r})")
    bank: Annotated[dict[str, Any], Field(max_length=MAX_LIST_ITEMS * 4)] | None = Field(
        default=None, description="The bank's settings (GET .../config's names); omit to keep"
    )
    mental_models: (
        Annotated[list[BankTemplateMentalModel], Field(max_length=MAX_LIST_ITEMS)] | None
    ) = None
    directives: Annotated[list[BankTemplateDirective], Field(max_length=MAX_LIST_ITEMS)] | None = (
        None
    )

    def template(self) -> Template:
        """The manifest as :mod:`heed.templates` takes it."""
        return Template(
            version=self.version,
            bank=self.bank,
            mental_models=None
            if self.mental_models is None
            else [
                TemplateModel(
                    m.id,
                    m.name,
                    m.source_query,
                    list(m.tags),
                    m.max_tokens,
                    m.trigger.patch() if m.trigger is not None else None,
                )
                for m in self.mental_models
            ],
            directives=None
            if self.directives is None
            else [
                TemplateDirective(d.name, d.content, d.priority, d.is_active, list(d.tags))
                for d in self.directives
            ],
        )


class BankTemplateImportResponse(BaseModel):
    bank_id: str
    config_applied: bool
    mental_models_created: list[str]
    mental_models_updated: list[str]
    directives_created: list[str]
    directives_updated: list[str]
    operation_ids: list[str]
    dry_run: bool


def manifest_of(template: Template) -> dict[str, Any]:
    """*template* as the manifest's JSON (parts the bank does not have left out)."""
    return {k: v for k, v in asdict(template).items() if v is not None}


def import_response(summary: ImportSummary) -> BankTemplateImportResponse:
    return BankTemplateImportResponse(**asdict(summary))
