"""Bank templates (:mod:`heed.templates`): hindsight-client's ``export_bank_template``
(``GET /v1/default/banks/{bank_id}/export``), ``import_bank_template``
(``POST .../import[?dry_run=true]``) and ``get_bank_template_schema``
(``GET /v1/bank-template-schema``: the manifest's JSON Schema)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from heed.api.deps import TemplatesDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire import templates as wire

__all__ = ["router"]

router = APIRouter(tags=["bank templates"], route_class=HeedRoute)


@router.get("/v1/bank-template-schema")
async def get_bank_template_schema() -> dict[str, Any]:
    """The JSON Schema of a bank template manifest (what ``.../import`` takes)."""
    return wire.BankTemplateManifest.model_json_schema()


@router.get("/v1/default/banks/{bank_id}/export")
async def export_bank_template(bank_id: IdPath, templates: TemplatesDep) -> dict[str, Any]:
    """The bank's setup as a manifest: its own settings, mental models (not knowledge-base
    pages) and directives; no memories and no mental model content."""
    return wire.manifest_of(await templates.export(bank_id))


@router.post("/v1/default/banks/{bank_id}/import")
async def import_bank_template(
    bank_id: IdPath,
    body: wire.BankTemplateManifest,
    templates: TemplatesDep,
    dry_run: Annotated[bool, Query(description="Check only; change nothing")] = False,
) -> wire.BankTemplateImportResponse:
    """Apply a manifest to the bank (created when missing): its settings, mental models
    created or updated by id (a created one starts its first refresh: ``operation_ids``),
    directives created or updated by name. The whole manifest is checked before anything
    is written."""
    summary = await templates.import_(bank_id, body.template(), dry_run=dry_run)
    return wire.import_response(summary)
