"""A bank's mental models: create, read, change, clear, delete, refresh, their history.

Every rule lives here, so the front ends only translate: a model's name and question are
not blank, its question is one a recall takes
(:meth:`heed.memory.engine.MemoryEngine.validate_query`), a custom id is lowercase letters,
digits and hyphens, its trigger holds only settings heed
implements (:func:`heed.mental_models.values.merge_trigger`, 400 naming the setting), a
bank holds at most :data:`~heed.mental_models.values.MAX_MENTAL_MODELS`. Creating a model
starts its first refresh (:mod:`heed.mental_models.refresh`); deleting one cancels its
refreshes and waits until they stopped before its rows go. Another tenant's bank, or a
model of another bank, is a 404 like a missing one.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, InvalidInput, NotFound, RecallQuery
from heed.mental_models.refresh import MentalModelRefreshes
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import (
    DEFAULT_MAX_TOKENS,
    HISTORY_LIMIT,
    MAX_MENTAL_MODELS,
    HistoryEntry,
    MentalModel,
    merge_trigger,
    tags_pass,
)
from heed.runs.model import Run
from heed.runtime import run_in_thread

__all__ = ["MODEL_ID_RE", "MentalModels", "check_model_id"]

#: A custom mental model id: lowercase letters, digits and hyphens, 1-64.
MODEL_ID_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def check_model_id(model_id: str) -> None:
    """Refuse a mental model id a client may not choose (:data:`MODEL_ID_RE`)."""
    if not MODEL_ID_RE.fullmatch(model_id):
        raise InvalidInput(
            f"invalid mental model id {model_id!r}: use 1-64 lowercase letters, digits and hyphens"
        )


#: What ``update`` may change.
_FIELDS: Final = ("name", "source_query", "tags", "max_tokens", "trigger")


@dataclass(eq=False)
class MentalModels:
    """See the module docstring."""

    engine: MemoryEngine
    store: MentalModelStore
    refreshes: MentalModelRefreshes

    # -- rules ---------------------------------------------------------------------------

    def check_text(self, name: str | None, source_query: str | None) -> None:
        """Refuse an empty *name*, or a *source_query* that is empty or that recall would
        refuse (:class:`InvalidInput` naming it)."""
        if name is not None and not name.strip():
            raise InvalidInput("name is empty")
        if source_query is not None:
            if not source_query.strip():
                raise InvalidInput("source_query is empty")
            try:
                self.engine.validate_query(RecallQuery(query=source_query))
            except InvalidInput as exc:
                raise InvalidInput(f"source_query: {exc}") from exc

    # -- reads ---------------------------------------------------------------------------

    async def get(self, bank: Bank, model_id: str) -> MentalModel:
        """The bank's model *model_id*; :class:`NotFound` naming it."""
        model = await run_in_thread(self.store.get_mental_model, bank.ref, model_id)
        if model is None:
            raise NotFound(f"mental model {model_id!r} not found")
        return model

    async def list_models(
        self,
        bank: Bank,
        *,
        tags: list[str] | None = None,
        tags_match: str = "any",
        exclude_pages: bool = False,
        offset: int = 0,
        limit: int = 100,
    ) -> tuple[list[MentalModel], int]:
        """``(page, total)``: the bank's models passing the tag filter (pages too unless
        *exclude_pages*), oldest first."""
        models = await run_in_thread(self.store.mental_models, bank.ref, False)
        kept = [
            m
            for m in models
            if (not exclude_pages or not m.is_page) and tags_pass(m.tags, tags, tags_match)
        ]
        return kept[offset : offset + limit], len(kept)

    async def history(self, bank: Bank, model_id: str) -> list[HistoryEntry]:
        """The model's earlier contents, newest first (at most ``HISTORY_LIMIT``)."""
        await self.get(bank, model_id)
        return await run_in_thread(self.store.mental_model_history, bank.ref, model_id)

    # -- writes --------------------------------------------------------------------------

    async def create(
        self,
        bank: Bank,
        *,
        name: str,
        source_query: str,
        model_id: str | None = None,
        tags: list[str] | None = None,
        max_tokens: int | None = None,
        trigger: dict[str, Any] | None = None,
        parent_id: str | None = None,
        is_page: bool = False,
    ) -> tuple[MentalModel, Run]:
        """Create a model (a page with *is_page*, under folder *parent_id*) and start its
        first refresh: the model and that run."""
        self.check_text(name, source_query)
        if model_id is not None:
            check_model_id(model_id)
        self.refreshes.reflect.check_provider()  # its first refresh must be able to run
        model = MentalModel(
            bank_ref=bank.ref,
            id=model_id or str(uuid.uuid4()),
            name=name.strip(),
            source_query=source_query,
            tags=list(dict.fromkeys(tags or [])),
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            trigger=merge_trigger(None, trigger),
            parent_id=parent_id,
            is_page=is_page,
        )
        model.embedding = await self.refreshes.lookup.embed(model)
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            created = await run_in_thread(self.store.create_mental_model, model, MAX_MENTAL_MODELS)
        run, _ = await self.refreshes.submit(bank, created, "created", enforce_interval=False)
        return created, run

    async def update(self, bank: Bank, model_id: str, patch: dict[str, Any]) -> MentalModel:
        """Change the fields *patch* names (``name``, ``source_query``, ``tags``,
        ``max_tokens``, ``trigger``: a patch over the stored trigger). The content stays
        until the next refresh."""
        current = await self.get(bank, model_id)
        changes = {k: v for k, v in patch.items() if k in _FIELDS and v is not None}
        self.check_text(changes.get("name"), changes.get("source_query"))
        if "name" in changes:
            changes["name"] = changes["name"].strip()
        if "trigger" in patch and patch["trigger"] is not None:
            changes["trigger"] = merge_trigger(current.trigger, patch["trigger"])
        if "tags" in changes:
            changes["tags"] = list(dict.fromkeys(changes["tags"]))
        if {"name", "source_query"} & set(changes):
            named = MentalModel(
                bank_ref=bank.ref,
                id=model_id,
                name=changes.get("name", current.name),
                source_query=changes.get("source_query", current.source_query),
                content=current.content,
            )
            changes["embedding"] = await self.refreshes.lookup.embed(named)
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            updated = await run_in_thread(
                self.store.update_mental_model, bank.ref, model_id, changes
            )
        if updated is None:
            raise NotFound(f"mental model {model_id!r} not found")
        return updated

    async def clear(self, bank: Bank, model_id: str) -> MentalModel:
        """Empty the model's content (it goes to the history); the next refresh writes it
        anew."""
        await self.get(bank, model_id)
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            cleared = await run_in_thread(
                lambda: self.store.write_mental_model_content(
                    bank.ref,
                    model_id,
                    "",
                    None,
                    None,
                    reason="cleared",
                    history_limit=HISTORY_LIMIT,
                    refreshed=False,
                )
            )
        if cleared is None:
            raise NotFound(f"mental model {model_id!r} not found")
        return cleared

    async def delete(self, bank: Bank, model_id: str) -> None:
        """Cancel the model's refreshes, wait until they stopped, then delete it."""
        await self.get(bank, model_id)
        await self.refreshes.cancel_model_runs(bank, [model_id])
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            deleted = await run_in_thread(self.store.delete_mental_model, bank.ref, model_id)
        if not deleted:
            raise NotFound(f"mental model {model_id!r} not found")

    async def refresh(self, bank: Bank, model_id: str) -> tuple[Run, bool]:
        """Start a refresh by hand: ``(run, deduplicated)``; sooner than the model's minimum
        interval is a 409 with ``Retry-After``."""
        model = await self.get(bank, model_id)
        return await self.refreshes.submit(bank, model, "manual")

    async def dry_run(self, bank: Bank, model_id: str) -> dict[str, Any]:
        """What a refresh would write now, written nowhere (see
        :meth:`heed.mental_models.refresh.MentalModelRefreshes.dry_run`)."""
        self.refreshes.reflect.check_provider()
        model = await self.get(bank, model_id)
        return await self.refreshes.dry_run(bank, model)
