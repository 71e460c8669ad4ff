"""Mental models (``/v1/default/banks/{bank_id}/mental-models``), hindsight-client compatible.

- ``POST ""``: create one; its first refresh starts (``operation_id``);
- ``GET ""``: list (``tags``, ``tags_match``, ``detail`` default ``metadata``, ``limit``,
  ``offset``, ``exclude_knowledge_pages``); ``GET /{id}``: one (``detail`` default
  ``full``); ``PATCH /{id}``: change it; ``DELETE /{id}``: delete it (its refreshes stop
  first);
- ``POST /{id}/refresh``: a refresh (an operation, also a run: ``GET /v1/runs/{id}/stream``);
  a busy one is returned with ``deduplicated: true``; sooner than the minimum interval: 409;
- ``POST /{id}/dry-run-refresh``: what a refresh would write, written nowhere;
- ``POST /{id}/clear``: empty its content; ``GET /{id}/history``: earlier contents, newest
  first.

The rules are :mod:`heed.mental_models`'s; this module translates.
"""

from __future__ import annotations

from operator import attrgetter

from fastapi import APIRouter

from heed.api.deps import MemoryDep, MentalModelsDep
from heed.api.input_rules import IdPath, Limit, Offset, TagsQuery
from heed.api.openapi import CONFLICT, UPSTREAM
from heed.api.routing import HeedRoute
from heed.api.wire import memory as memory_wire
from heed.api.wire import mental_models as wire
from heed.memory.bank_runs import status_of
from heed.memory.models import Bank
from heed.mental_models.values import MentalModel

__all__ = ["model_out", "router", "trigger_out"]

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/mental-models",
    tags=["mental-models"],
    route_class=HeedRoute,
)


def trigger_out(model: MentalModel) -> wire.TriggerOut:
    return wire.TriggerOut.model_validate(model.trigger)


#: The detail levels, each adding the model's fields named in :data:`_DETAIL_FIELDS` (and
#: from ``content`` on, its trigger) to those of the levels before it.
_LEVELS: tuple[wire.Detail, ...] = ("metadata", "content", "full")
_DETAIL_FIELDS: dict[wire.Detail, tuple[str, ...]] = {
    "metadata": (
        "id",
        "name",
        "tags",
        "last_refreshed_at",
        "last_refresh_failed_at",
        "created_at",
        "is_stale",
    ),
    "content": ("source_query", "content", "max_tokens"),
    "full": ("reflect_response",),
}


def model_out(bank: Bank, model: MentalModel, detail: wire.Detail) -> wire.MentalModelOut:
    """A model on the wire at *detail*: ``metadata`` (names, tags, staleness), ``content``
    (adds the content and its configuration), ``full`` (adds the reflect response)."""
    levels = _LEVELS[: _LEVELS.index(detail) + 1]
    names = [name for level in levels for name in _DETAIL_FIELDS[level]]
    fields = dict(zip(names, attrgetter(*names)(model), strict=True))
    out = wire.MentalModelOut(
        **fields,
        bank_id=bank.bank_id,
        last_full_refreshed_at=model.last_refreshed_at,
        is_knowledge_page=model.is_page,
    )
    if detail != "metadata":
        out.trigger = trigger_out(model)
    return out


@router.post("", responses={**CONFLICT, **UPSTREAM})
async def create_mental_model(
    bank_id: IdPath, body: wire.CreateMentalModelRequest, engine: MemoryDep, models: MentalModelsDep
) -> wire.CreateMentalModelResponse:
    """Create a mental model; its content is written by the refresh it starts."""
    bank = await engine.get_bank(bank_id)
    model, run = await models.create(bank, model_id=body.id, **wire.model_options(body))
    return wire.CreateMentalModelResponse(mental_model_id=model.id, operation_id=run.id)


@router.get("")
async def list_mental_models(
    bank_id: IdPath,
    engine: MemoryDep,
    models: MentalModelsDep,
    tags: TagsQuery = None,
    tags_match: wire.TagsMatch = "any",
    detail: wire.Detail = "metadata",
    limit: Limit = 100,
    offset: Offset = 0,
    exclude_knowledge_pages: bool = False,
) -> wire.MentalModelListResponse:
    """The bank's mental models, oldest first."""
    bank = await engine.get_bank(bank_id)
    items, total = await models.list_models(
        bank,
        tags=tags,
        tags_match=tags_match,
        exclude_pages=exclude_knowledge_pages,
        offset=offset,
        limit=limit,
    )
    return wire.MentalModelListResponse(
        items=[model_out(bank, m, detail) for m in items], total=total, limit=limit, offset=offset
    )


@router.get("/{mental_model_id}")
async def get_mental_model(
    bank_id: IdPath,
    mental_model_id: IdPath,
    engine: MemoryDep,
    models: MentalModelsDep,
    detail: wire.Detail = "full",
) -> wire.MentalModelOut:
    """One mental model."""
    bank = await engine.get_bank(bank_id)
    return model_out(bank, await models.get(bank, mental_model_id), detail)


@router.patch("/{mental_model_id}", responses={**CONFLICT})
async def update_mental_model(
    bank_id: IdPath,
    mental_model_id: IdPath,
    body: wire.UpdateMentalModelRequest,
    engine: MemoryDep,
    models: MentalModelsDep,
) -> wire.MentalModelOut:
    """Change a model's name, question, tags, budget or trigger (a patch)."""
    bank = await engine.get_bank(bank_id)
    updated = await models.update(bank, mental_model_id, wire.options_patch(body))
    return model_out(bank, updated, "full")


@router.delete("/{mental_model_id}")
async def delete_mental_model(
    bank_id: IdPath, mental_model_id: IdPath, engine: MemoryDep, models: MentalModelsDep
) -> memory_wire.DeleteResponse:
    """Delete a model (its running refresh stops first) and its history."""
    bank = await engine.get_bank(bank_id)
    await models.delete(bank, mental_model_id)
    return memory_wire.deleted(f"mental model {mental_model_id!r} deleted", 1)


@router.post("/{mental_model_id}/refresh", responses={**CONFLICT, **UPSTREAM})
async def refresh_mental_model(
    bank_id: IdPath,
    mental_model_id: IdPath,
    engine: MemoryDep,
    models: MentalModelsDep,
    body: wire.RefreshMentalModelRequest | None = None,
) -> wire.AsyncOperationSubmitResponse:
    """Start a refresh (a run; ``mode`` may only be ``full``, what every refresh is)."""
    bank = await engine.get_bank(bank_id)
    run, deduplicated = await models.refresh(bank, mental_model_id)
    return wire.AsyncOperationSubmitResponse(
        operation_id=run.id, status=status_of(run), deduplicated=deduplicated
    )


@router.post("/{mental_model_id}/dry-run-refresh", responses={**UPSTREAM})
async def dry_run_refresh_mental_model(
    bank_id: IdPath, mental_model_id: IdPath, engine: MemoryDep, models: MentalModelsDep
) -> wire.MentalModelDryRunResult:
    """What a refresh would write now; nothing is written."""
    bank = await engine.get_bank(bank_id)
    return wire.MentalModelDryRunResult.model_validate(await models.dry_run(bank, mental_model_id))


@router.post("/{mental_model_id}/clear")
async def clear_mental_model(
    bank_id: IdPath, mental_model_id: IdPath, engine: MemoryDep, models: MentalModelsDep
) -> wire.MentalModelOut:
    """Empty a model's content (kept in its history)."""
    bank = await engine.get_bank(bank_id)
    return model_out(bank, await models.clear(bank, mental_model_id), "full")


@router.get("/{mental_model_id}/history")
async def mental_model_history(
    bank_id: IdPath, mental_model_id: IdPath, engine: MemoryDep, models: MentalModelsDep
) -> list[wire.MentalModelHistoryEntry]:
    """The model's earlier contents, newest first (bounded)."""
    bank = await engine.get_bank(bank_id)
    entries = await models.history(bank, mental_model_id)
    return [wire.MentalModelHistoryEntry.model_validate(e, from_attributes=True) for e in entries]
