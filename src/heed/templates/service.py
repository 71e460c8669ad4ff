"""Export and import of bank templates (see the package docstring).

**Export** reads the bank's own settings (the overrides, not the server's defaults: a
template says what was chosen for this bank), its mental models (not knowledge-base pages,
which belong to their folders) and all its directives.

**Import** checks the whole manifest first: the settings (a setting heed does not take is
a 400 naming it), each model's id, name, question and trigger, each directive's fields.
Nothing is written when any of it is refused. Then it creates the bank when it does not
exist, applies the settings, creates or updates each mental model by id (a created one
starts its first refresh: its run id is in ``operation_ids``; an updated one keeps its
content until its next refresh) and each directive by name. With ``dry_run`` it stops
after the checks and says what it would create and update.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from heed.memory.bank_config import settings as bank_config
from heed.memory.directives.rules import DirectivePatch
from heed.memory.directives.service import DirectiveService, check_patch
from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, NotFound
from heed.mental_models.service import MentalModels, check_model_id
from heed.mental_models.values import merge_trigger
from heed.templates.manifest import (
    CURRENT_VERSION,
    ImportSummary,
    Template,
    TemplateDirective,
    TemplateModel,
)

__all__ = ["BankTemplates"]

#: Directives read per page when a template lists or matches them.
_PAGE = 1000


class BankTemplates:
    """Bank templates over the services that own each part (module docstring)."""

    def __init__(
        self, engine: MemoryEngine, directives: DirectiveService, mental_models: MentalModels
    ) -> None:
        self.engine = engine
        self.directives = directives
        self.mental_models = mental_models

    async def export(self, bank_id: str) -> Template:
        """The bank's template; :class:`NotFound` for an unknown bank."""
        bank = await self.engine.get_bank(bank_id)
        models, _ = await self.mental_models.list_models(bank, exclude_pages=True, limit=10**6)
        directives, _ = await self.directives.list_directives(
            bank_id, None, active_only=False, limit=_PAGE
        )
        return Template(
            version=CURRENT_VERSION,
            bank=bank_config.overrides(bank) or None,
            mental_models=[
                TemplateModel(m.id, m.name, m.source_query, list(m.tags), m.max_tokens, m.trigger)
                for m in models
            ]
            or None,
            directives=[
                TemplateDirective(d.name, d.content, d.priority, d.is_active, list(d.tags))
                for d in directives
            ]
            or None,
        )

    async def import_(self, bank_id: str, template: Template, *, dry_run: bool) -> ImportSummary:
        """Apply *template* to the bank (created when missing), or with *dry_run* only check
        it. Raises :class:`InvalidInput` naming what the manifest gets wrong, before
        anything is written."""
        settings = bank_config.validate(template.bank or {}, where="bank")
        for model in template.mental_models or ():
            check_model_id(model.id)
            self.mental_models.check_text(model.name, model.source_query)
            merge_trigger(None, model.trigger)
        for directive in template.directives or ():
            check_patch(
                DirectivePatch(
                    directive.name,
                    directive.content,
                    directive.priority,
                    directive.is_active,
                    directive.tags,
                )
            )
        bank = await self.engine.find_bank(bank_id)
        existing_models, existing_directives = await self._existing(bank)
        summary = ImportSummary(bank_id=bank.bank_id if bank else bank_id, config_applied=False)
        for model in template.mental_models or ():
            known = model.id in existing_models
            (summary.mental_models_updated if known else summary.mental_models_created).append(
                model.id
            )
        for directive in template.directives or ():
            known = directive.name in existing_directives
            (summary.directives_updated if known else summary.directives_created).append(
                directive.name
            )
        summary.config_applied = template.bank is not None
        if summary.mental_models_created:  # each starts a refresh: it must be able to run
            self.mental_models.refreshes.reflect.check_provider()
        if dry_run:
            summary.dry_run = True
            return summary
        if bank is None:
            bank = await self.engine.put_bank(bank_id, {})
        if template.bank is not None:
            bank = await self.engine.change_bank(
                bank.bank_id, lambda b: bank_config.apply(b, settings)
            )
        for model in template.mental_models or ():
            await self._put_model(bank, model, model.id in existing_models, summary)
        for directive in template.directives or ():
            await self._put_directive(bank, directive, existing_directives.get(directive.name))
        return summary

    async def _existing(self, bank: Bank | None) -> tuple[set[str], dict[str, str]]:
        """The ids of the bank's mental models and its directives' ids by name."""
        if bank is None:
            return set(), {}
        models, _ = await self.mental_models.list_models(bank, exclude_pages=False, limit=10**6)
        directives, _ = await self.directives.list_directives(
            bank.bank_id, None, active_only=False, limit=_PAGE
        )
        return {m.id for m in models}, {d.name: d.id for d in directives}

    async def _put_model(
        self, bank: Bank, model: TemplateModel, known: bool, summary: ImportSummary
    ) -> None:
        fields: dict[str, Any] = {
            "name": model.name,
            "source_query": model.source_query,
            "tags": model.tags,
            "max_tokens": model.max_tokens,
            "trigger": model.trigger,
        }
        if known:
            try:
                await self.mental_models.update(bank, model.id, fields)
                return
            except NotFound:  # deleted since it was read: create it as the template says
                pass
        _, run = await self.mental_models.create(bank, model_id=model.id, **fields)
        summary.operation_ids.append(run.id)

    async def _put_directive(
        self, bank: Bank, directive: TemplateDirective, directive_id: str | None
    ) -> None:
        fields = asdict(directive)
        if directive_id is not None:
            try:
                await self.directives.update(bank.bank_id, directive_id, DirectivePatch(**fields))
                return
            except NotFound:
                pass
        await self.directives.create(bank.bank_id, **fields)
