"""Refreshing a mental model: a background run of kind ``mental_model_refresh``.

A refresh asks the model's ``source_query`` of its bank with the one reflect heed has
(:class:`heed.reflect.ReflectService`'s agent, scoped to the model's tags and trigger, the
model itself excluded from the mental models it consults) and writes the answer as the
model's content; the content it replaces goes to the model's history
(:data:`~heed.mental_models.values.HISTORY_LIMIT` kept). Creating a model starts one; so do
``POST .../refresh`` and the triggers (:mod:`heed.mental_models.triggers`).

**How it runs.** Each refresh is a run in the bank's run group (``bank:<ref>``), listed with
the bank's operations (:data:`heed.memory.bank_runs.OPERATION_KINDS`):

- *one at a time per model, across instances*: a refresh asked while one of the same model
  is busy returns the busy run (``deduplicated``), decided in the admission transaction
  under the group's lock;
- *a minimum interval*: a refresh asked sooner than the model's
  ``min_refresh_interval_seconds`` (its trigger's, else its bank's config
  ``mental_model_min_refresh_interval_seconds``, else
  ``HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS``) after its last one is refused
  (:class:`RefreshTooSoon`, 409 with ``Retry-After``); the
  triggers wait instead;
- *it yields*: the reflect takes its reflect slot, and its recalls theirs, with
  ``background=True`` (:mod:`heed.runtime.slots`);
- *it stops*: its token is the run's, so ``POST /v1/runs/{id}/cancel``, ``DELETE
  .../operations/{id}``, its wall-clock ceiling (``HEED_MENTAL_MODEL_REFRESH_MAX_SECONDS``),
  deleting the model and deleting the bank stop it mid-LLM-call; the bank's work registry
  (:meth:`heed.memory.engine.MemoryEngine.track`) makes a bank delete wait until it stopped.
  The content is written in one transaction at the very end, after a last token check, so a
  cancelled refresh leaves the content as it was;
- *journaled*: ``progress`` events (``stage``, ``processed`` of ``total``) and the reflect's
  ``tool_call`` / ``tool_result`` / ``message`` events, on ``GET /v1/runs/{id}/stream``;
- *it survives dead workers, within a budget* (:data:`MAX_ATTEMPTS`; writing the content is
  idempotent).

**Skipped when nothing it reads changed.** Before the LLM is asked, a refresh computes its
model's source fingerprint (:mod:`heed.mental_models.fingerprint`: the request, the bank's
reflect settings, the directives, the mental models it may consult, the provider and the
memories in the model's scope). When it equals the one stored with the content by the last
refresh, the run completes at once with the result ``{"skipped": "sources unchanged",
"outcome": "content_preserved_no_new_facts", "llm_calls": 0, ...}``: no LLM call, content and
history untouched, ``last_refreshed_at`` stamped (the content is current as of now). This
holds for a refresh asked by hand too (the client's refresh request has no field to force
one; change the model, e.g. its ``max_tokens``, or clear it, to force a rewrite). Skips are
counted per trigger (:meth:`MentalModelRefreshes.skipped`, exported as
``heed_mental_model_refresh_skipped_total``).

A **dry run** (:meth:`MentalModelRefreshes.dry_run`) runs the same reflect under the
request's token in an interactive slot and reports what a refresh would write, writing
nothing.
"""

from __future__ import annotations

import difflib
import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from heed.llm.usage import llm_work
from heed.memory.bank_runs import (
    MENTAL_MODEL_REFRESH_KIND,
    BankRunService,
    bank_payload,
    bank_run,
    bank_session,
)
from heed.memory.models import Bank, Conflict
from heed.mental_models.fingerprint import source_fingerprint
from heed.mental_models.lookup import MentalModelLookup
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import (
    HISTORY_LIMIT,
    MentalModel,
    scope_of,
)
from heed.reflect import ReflectRequest
from heed.reflect.agent import ReflectOutcome
from heed.reflect.result import ResultShape, reflect_result
from heed.reflect.service import ReflectService
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import AdmissionAborted
from heed.runs.model import Run
from heed.runtime import (
    OperationCancelled,
    raise_if_cancelled,
    reraise_cancellation,
    run_in_thread,
)

__all__ = [
    "MAX_ATTEMPTS",
    "MENTAL_MODEL_REFRESH_KIND",
    "MODEL_DELETED",
    "SKIPPED",
    "MentalModelRefreshes",
    "RefreshLimits",
    "RefreshTooSoon",
]

#: Worker deaths while refreshing after which a refresh is quarantined.
MAX_ATTEMPTS: Final = 3
#: The cancel reason of a refresh whose model was deleted.
MODEL_DELETED: Final = "mental model deleted"
_STAGES: Final = 2  # reflecting, writing
#: The ``skipped`` word of a refresh whose sources had not changed since the last one.
SKIPPED: Final = "sources unchanged"
#: The outcome such a refresh reports (hindsight-client's word for it).
_SKIPPED_OUTCOME: Final = "content_preserved_no_new_facts"


@dataclass(frozen=True, slots=True)
class RefreshLimits:
    """How refreshes are bounded (``HEED_MENTAL_MODEL_REFRESH_MAX_SECONDS``; the server's
    least interval is a bank setting's default: :meth:`MemoryEngine.settings`)."""

    max_seconds: float = 600.0


class RefreshTooSoon(Conflict):
    """A refresh asked before the model's minimum interval since its last one (409)."""

    def __init__(self, model_id: str, interval: float, remaining: float) -> None:
        super().__init__(
            f"mental model {model_id!r} was refreshed less than {interval:g} s ago (its minimum"
            f" refresh interval); retry in {math.ceil(remaining)} s",
            retry_after=max(1, math.ceil(remaining)),
        )


def _parse(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


@dataclass(eq=False)
class MentalModelRefreshes(BankRunService):
    """Submits, runs, dry-runs and stops refreshes (see the module docstring)."""

    KINDS: ClassVar[tuple[str, ...]] = (MENTAL_MODEL_REFRESH_KIND,)

    reflect: ReflectService
    store: MentalModelStore
    lookup: MentalModelLookup
    limits: RefreshLimits = field(default_factory=RefreshLimits)
    _skipped: Counter[str] = field(init=False, default_factory=Counter)
    _skipped_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def skipped(self) -> dict[str, int]:
        """Refreshes skipped because their sources had not changed, in this process, by
        trigger (``created``, ``manual``, ``trigger``)."""
        with self._skipped_lock:
            return dict(self._skipped)

    def kind_spec(self) -> KindSpec:
        """How refreshes execute: register it as :data:`MENTAL_MODEL_REFRESH_KIND`."""
        return KindSpec(execute=self._execute, max_attempts=MAX_ATTEMPTS)

    # -- starting ------------------------------------------------------------------------

    def min_interval(self, bank: Bank, model: MentalModel) -> float:
        """The least time between two refreshes of *model* (see the module docstring)."""
        own = model.trigger.get("min_refresh_interval_seconds")
        if own is not None:
            return float(own)
        return self.engine.settings(bank).mental_model_min_refresh_interval_seconds

    def remaining(self, bank: Bank, model: MentalModel) -> float:
        """Seconds until *model* may be refreshed again (0: now)."""
        last = _parse(model.last_refreshed_at)
        if last is None:
            return 0.0
        return max(0.0, last + self.min_interval(bank, model) - time.time())

    async def submit(
        self, bank: Bank, model: MentalModel, trigger: str, *, enforce_interval: bool = True
    ) -> tuple[Run, bool]:
        """Start a refresh of *model* unless one is busy: ``(run, deduplicated)``, the busy
        run with ``True`` when there was one. With *enforce_interval*, a refresh sooner than
        the model's minimum interval is :class:`RefreshTooSoon`. The reflect provider's
        error (400) when it cannot be built, before anything is written."""
        self.reflect.check_provider()
        if enforce_interval:
            remaining = self.remaining(bank, model)
            if remaining > 0:
                raise RefreshTooSoon(model.id, self.min_interval(bank, model), remaining)
        session = bank_session(bank)

        def only_one(admitted: Run) -> None:  # in the admission transaction, under the lock
            busy = self._busy(bank, model.id)
            if any(run.id != admitted.id for run in busy):
                raise AdmissionAborted()

        run = await self.manager.submit(
            MENTAL_MODEL_REFRESH_KIND,
            tenant=bank.tenant,
            session_id=session,
            payload={
                **bank_payload(bank),
                "mental_model_id": model.id,
                "trigger": trigger,
            },
            summary={"bank_id": bank.bank_id, "mental_model_id": model.id, "trigger": trigger},
            on_admitted=only_one,
        )
        if run is not None:
            return run, False
        busy = await self.manager.io.call(lambda: self._busy(bank, model.id))
        if busy:
            return busy[0], True
        return await self.submit(bank, model, trigger, enforce_interval=False)  # ended meanwhile

    def _busy(self, bank: Bank, model_id: str) -> list[Run]:
        return self.manager.store.list_runs(
            tenant=bank.tenant,
            session_id=bank_session(bank),
            kind=MENTAL_MODEL_REFRESH_KIND,
            non_terminal=True,
            summary_equals={"mental_model_id": model_id},
        )

    async def cancel_model_runs(self, bank: Bank, model_ids: list[str]) -> None:
        """Cancel the unfinished refreshes of *model_ids* and wait until they stopped (before
        the models are deleted)."""
        for model_id in model_ids:
            runs = await self.manager.io.call(functools.partial(self._busy, bank, model_id))
            for run in runs:
                await self.manager.cancel(run.id, MODEL_DELETED, tenant=bank.tenant, wait=True)

    # -- running -------------------------------------------------------------------------

    def _request(self, model: MentalModel) -> ReflectRequest:
        tags, match = scope_of(model)
        trigger = model.trigger
        return ReflectRequest(
            query=model.source_query,
            budget=trigger.get("budget") or "low",
            max_tokens=model.max_tokens,
            tags=tags,
            tags_match=match,  # type: ignore[arg-type]
            exclude_mental_models=bool(trigger.get("exclude_mental_models")),
            exclude_mental_model_ids=[model.id, *(trigger.get("exclude_mental_model_ids") or [])],
            fact_types=trigger.get("fact_types"),
        )

    async def _execute(self, rc: RunContext) -> dict[str, Any]:
        payload = rc.payload
        async with bank_run(self.engine, rc) as bank:
            rc.token.set_deadline(time.monotonic() + self.limits.max_seconds)
            model_id = payload["mental_model_id"]
            async with self.engine.track(bank):
                model = await run_in_thread(self.store.get_mental_model, bank.ref, model_id)
                if model is None:
                    raise OperationCancelled(MODEL_DELETED)
                request = self._request(model)
                provider = self.reflect.provider
                fingerprint = await source_fingerprint(
                    self.engine,
                    self.store,
                    bank,
                    model_id,
                    request,
                    (provider.name, provider.model),
                )
                if await self._unchanged(bank, model, fingerprint):
                    self._count_skip(str(payload.get("trigger")))
                    await self._progress(rc, "skipped", _STAGES, model_id)
                    result = self._result(model, payload, _SKIPPED_OUTCOME, model.content)
                    return {**result, "skipped": SKIPPED, "llm_calls": 0}
                await self._progress(rc, "reflecting", 0, model_id)

                async def to_journal(event: EventType, data: dict[str, Any]) -> None:
                    if event in (EventType.TOOL_CALL, EventType.TOOL_RESULT, EventType.MESSAGE):
                        await rc.emit(event, data)

                try:
                    with llm_work(
                        bank.tenant, bank.bank_id, "mental_model_refresh", background=True
                    ):
                        outcome = await self.reflect.agent().run(
                            bank, request, to_journal, background=True
                        )
                except Exception as exc:
                    reraise_cancellation(exc)
                    await run_in_thread(self.store.mark_refresh_failed, bank.ref, model_id)
                    raise
                text = outcome.text.strip()
                if not text:
                    await run_in_thread(self.store.mark_refresh_failed, bank.ref, model_id)
                    return self._result(model, payload, "refresh_failed_empty_candidate", "")
                await self._progress(rc, "writing", 1, model_id)
                response = reflect_result(
                    outcome, ResultShape(facts=True, trace=bool(model.trigger.get("keep_trace")))
                )
                embedding = await self.lookup.embed(replace(model, content=text))
                written = await run_in_thread(
                    self._write, bank, model_id, text, response, embedding, fingerprint
                )
                if written is None:
                    raise OperationCancelled(MODEL_DELETED)
                await self._progress(rc, "done", 2, model_id)
        outcome_name = "content_unchanged" if model.content == text else "content_written"
        return self._result(model, payload, outcome_name, text)

    async def _unchanged(self, bank: Bank, model: MentalModel, fingerprint: str) -> bool:
        """Whether *model*'s content was written from sources whose fingerprint is
        *fingerprint* (then ``last_refreshed_at`` is stamped and the refresh is skipped)."""
        if not model.content.strip():
            return False
        stored = await run_in_thread(self.store.refresh_fingerprint, bank.ref, model.id)
        if stored != fingerprint:
            return False
        return await run_in_thread(self.store.mark_refresh_skipped, bank.ref, model.id, fingerprint)

    def _count_skip(self, trigger: str) -> None:
        with self._skipped_lock:
            self._skipped[trigger] += 1

    def _write(
        self,
        bank: Bank,
        model_id: str,
        text: str,
        response: dict[str, Any],
        embedding: Any,
        fingerprint: str,
    ) -> MentalModel | None:
        raise_if_cancelled()  # a cancel that came during the reflect writes nothing
        return self.store.write_mental_model_content(
            bank.ref,
            model_id,
            text,
            response,
            embedding,
            reason="refreshed",
            history_limit=HISTORY_LIMIT,
            refreshed=True,
            fingerprint=fingerprint,
        )

    async def _progress(self, rc: RunContext, stage: str, processed: int, model_id: str) -> None:
        await rc.emit(
            EventType.PROGRESS,
            {
                "stage": stage,
                "processed": processed,
                "total": _STAGES,
                "mental_model_id": model_id,
            },
        )

    @staticmethod
    def _result(
        model: MentalModel, payload: Mapping[str, Any], outcome: str, text: str
    ) -> dict[str, Any]:
        return {
            "mental_model_id": model.id,
            "trigger": payload.get("trigger"),
            "outcome": outcome,
            "content_chars": len(text),
        }

    # -- dry run -------------------------------------------------------------------------

    async def dry_run(self, bank: Bank, model: MentalModel) -> dict[str, Any]:
        """What a refresh of *model* would write, written nowhere (the
        ``MentalModelDryRunRefreshResult`` shape): the same reflect, under the caller's
        token, in an interactive reflect slot."""
        started = time.perf_counter()
        window_end = datetime.now(UTC).isoformat()
        request = self._request(model)
        async with self.engine.track(bank):
            with llm_work(bank.tenant, bank.bank_id, "mental_model_refresh"):
                outcome = await self.reflect.run(bank, request)
        candidate = outcome.text.strip()
        if not candidate:
            name = "refresh_failed_empty_candidate"
        elif candidate == model.content:
            name = "content_unchanged"
        else:
            name = "content_written"
        preview = candidate if candidate else model.content
        diff = "".join(
            difflib.unified_diff(
                model.content.splitlines(keepends=True),
                preview.splitlines(keepends=True),
                fromfile="current",
                tofile="preview",
            )
        )
        duration = int((time.perf_counter() - started) * 1000)
        response = reflect_result(outcome, ResultShape(facts=True, trace=True))
        trace = {
            "effective_mode": "full",
            "outcome": name,
            "tool_calls": (response["trace"] or {}).get("tool_calls", []),
            "llm_calls": (response["trace"] or {}).get("llm_calls", []),
            "usage": response["usage"],
            "duration_ms": duration,
        }
        return {
            "mental_model_id": model.id,
            "name": model.name,
            "requested_mode": "full",
            "effective_mode": "full",
            "outcome": name,
            "would_persist": name == "content_written",
            "scope": {
                "tags": request.tags,
                "tags_match": request.tags_match,
                "fact_types": request.fact_types,
                "exclude_mental_models": request.exclude_mental_models,
                "exclude_mental_model_ids": request.exclude_mental_model_ids,
            },
            "window": {"created_before": window_end},
            "facts": _fact_counts(outcome),
            "based_on": _evidence(response),
            "current_content": model.content,
            "candidate_content": candidate,
            "preview_content": preview,
            "diff": diff,
            "trace": trace,
            "usage": response["usage"],
            "duration_ms": duration,
            "warnings": [] if candidate else ["the reflect gave no answer: nothing would change"],
        }


def _fact_counts(outcome: ReflectOutcome) -> dict[str, dict[str, int]]:
    used: dict[str, int] = {}
    for unit in outcome.based_on:
        used[unit.fact_type] = used.get(unit.fact_type, 0) + 1
    retrieved = 0
    for call in outcome.tool_calls:
        if call.tool == "recall" and call.output:
            retrieved += len(call.output.get("memories") or [])
    return {"retrieved": {"all": retrieved}, "used": used}


def _evidence(response: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_type: dict[str, list[dict[str, Any]]] = {}
    for fact in (response.get("based_on") or {}).get("memories", []):
        by_type.setdefault(str(fact.get("type") or "world"), []).append(fact)
    return by_type
