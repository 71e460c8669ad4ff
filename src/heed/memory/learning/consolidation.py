"""Consolidation: new facts become *observations*, beliefs that are updated as evidence
arrives, in background runs that stop when asked and never starve a user's request.

**What it does.** A bank that keeps observations (``enable_observations``) marks the units
its retains write as ``pending`` (:meth:`heed.memory.engine.MemoryEngine.retain`). A
consolidation run takes them in **rounds** of at most :attr:`ConsolidationLimits.batch`
units, oldest first, grouped into **scopes** (tag sets: :mod:`heed.memory.learning.scopes`; by
default each fact's own tags; an observation carries its scope's tags and rests only on
facts of its scope). For each scope it recalls the related observations (a real recall, of
type ``observation``, in the scope, at most :attr:`ConsolidationLimits.related`), and asks
the LLM (structured output, with the scope's mission) which observations to create,
update or merge, each citing the facts it rests on. One transaction per scope writes the
result and marks the facts ``done``
(:meth:`heed.memory.store.LearningStore.write_observations`). An updated observation keeps
its id; its earlier text goes to its ``history`` (at most :data:`HISTORY_LIMIT` versions);
a merged one is removed and named in the survivor's history. A scope whose reply stays
malformed marks its facts ``failed`` (``recover`` makes
them pending again); an upstream failure ends the run ``failed`` with its facts still
pending.

**How it runs.** Each consolidation is a run of kind ``consolidation`` in the bank's run
group (``bank:<ref>``, listed with the bank's operations):

- *one at a time per bank, across instances*: a start is admitted only when the bank has no
  busy consolidation run (checked under the group's lock in the run store); retains
  schedule one after :attr:`ConsolidationLimits.debounce` seconds of quiet, and a run keeps
  taking rounds until nothing is pending, so facts written meanwhile are taken too; at
  start-up every bank with pending facts is scheduled (:meth:`Consolidation.resume`), so a
  run that a shutdown ended ``interrupted`` is picked up again;
- *beside a long retain*: while an asynchronous retain still writes into the bank
  (:class:`heed.memory.retain.flow.RetainsInFlight`: it writes each document when it is
  ready), a run takes only whole rounds and waits for the next document for the rest, so
  consolidating during an import makes no more model calls than after it;
- *side by side*: a run takes as many rounds at once as its provider lets background work
  have in flight (:func:`heed.llm.gate.call_concurrency`: all but one of a remote
  upstream's ``HEED_LLM_CONCURRENCY``; one on the embedded model), across scopes and
  within one; a round never overwrites what another changed since it read
  (:mod:`heed.memory.learning.observations`);
- *it yields*: its recalls take recall slots with ``background=True``
  (:mod:`heed.runtime.slots`), and its model calls wait behind users' at a remote
  upstream's gate (:mod:`heed.llm.gate`), or take reflect slots with ``background=True``
  on the embedded model: never a slot a user's request waits for, at full speed when the
  server is idle, and never starved forever;
- *it stops*: its token is the run's, so ``POST /v1/runs/{id}/cancel``, ``DELETE
  .../operations/{id}``, the wall-clock ceiling (:attr:`ConsolidationLimits.max_seconds`)
  and a bank delete stop it mid-LLM-call; the bank's work registry
  (:meth:`~heed.memory.engine.MemoryEngine.track`) makes the delete wait until it stopped,
  and the round's write checks the bank's row in its transaction, so nothing is written
  into a deleted bank;
- *it survives dead workers, within a budget*: a worker that dies while processing leaves
  the run to be claimed again; after :data:`MAX_ATTEMPTS` deaths the run is quarantined
  (:mod:`heed.runs.state`);
- *bounded memory*: a round holds its batch, its related observations and one reply; what
  a run keeps across rounds is counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Final

from heed.llm.base import BadModelOutput, ChatMessage, ChatProvider, JsonSchemaFormat
from heed.llm.gate import call_concurrency, model_slot
from heed.llm.observe import LlmObserver, observing
from heed.llm.structured import complete_json, index_list
from heed.llm.usage import llm_work
from heed.memory.bank_config.view import BankSettings
from heed.memory.bank_runs import (
    CONSOLIDATION_KIND,
    BankRunService,
    BankTimers,
    bank_payload,
    bank_run,
    bank_session,
)
from heed.memory.learning.observations import HISTORY_LIMIT, ObservationVersions, plan_actions
from heed.memory.learning.scopes import Scope, ScopeRule, mission_for, scope_rule, scopes_of
from heed.memory.models import (
    Bank,
    NotFound,
    PreparedUnit,
    RecallQuery,
    StoredUnit,
    loose_units,
)
from heed.memory.store import ObservationChanges
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.model import Run
from heed.runtime import (
    Lane,
    OperationCancelled,
    raise_if_cancelled,
    reraise_cancellation,
    run_all,
    run_in_thread,
)

__all__ = [
    "CONSOLIDATION_KIND",
    "HISTORY_LIMIT",
    "MAX_ATTEMPTS",
    "OBSERVATIONS_SCHEMA",
    "Consolidation",
    "ConsolidationLimits",
]

#: Worker deaths while processing after which a consolidation is quarantined.
MAX_ATTEMPTS: Final = 3
#: How many rounds per concurrent model call one read of the pending facts feeds (progress
#: is journalled after each such set).
ROUNDS_PER_SLOT: Final = 4
#: The most recalls a scope's round makes for its related observations.
RELATED_QUERIES: Final = 4
#: The longest query text of one of those recalls.
QUERY_CHARS: Final = 400
#: The longest a run taking whole rounds waits for a retain's next document before it looks
#: at the pending facts again.
RETAIN_WAIT_SECONDS: Final = 1.0
#: The most banks :meth:`Consolidation.resume` schedules at start-up.
RESUME_LIMIT: Final = 10_000

log = logging.getLogger("heed.memory")

OBSERVATIONS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["actions"],
    "properties": {
        "actions": {
            "type": "array",
            "maxItems": 64,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["action", "text", "facts"],
                "properties": {
                    "action": {"enum": ["create", "update", "merge"]},
                    "observations": index_list(16),
                    "text": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "facts": index_list(64),
                },
            },
        }
    },
}
_FORMAT: Final = JsonSchemaFormat(name="observations", schema=OBSERVATIONS_SCHEMA, strict=False)
_INSTRUCTIONS: Final = (
    "You maintain observations: durable beliefs about people, things and patterns, "
    "consolidated from facts. You are given new facts (F0, F1, ...) and existing "
    'observations (O0, O1, ...). Answer with JSON {"actions": [...]}, each action: '
    '{"action": "create", "text", "facts": [F numbers]} for a new observation; '
    '{"action": "update", "observations": [one O number], "text", "facts"} when '
    "the facts refine or contradict an observation (write the whole new text); "
    '{"action": "merge", "observations": [O numbers], "text", "facts"} when '
    "observations say the same thing. Every observation cites the facts it rests on. "
    "Facts that teach nothing durable need no action."
)


@dataclass(frozen=True, slots=True)
class ConsolidationLimits:
    """How consolidation is bounded (settings ``HEED_CONSOLIDATION_*``)."""

    batch: int = 16
    related: int = 24
    debounce: float = 2.0
    max_seconds: float = 1800.0


@dataclass(slots=True)
class _Counters:
    rounds: int = 0
    facts: int = 0
    failed: int = 0
    created: int = 0
    updated: int = 0
    merged: int = 0
    #: Updates written as new observations: another round changed theirs meanwhile.
    conflicts: int = 0
    llm_retries: int = 0
    llm_failures: int = 0
    errors: list[str] = field(default_factory=list)
    #: The scopes (tag sets) whose observations the run changed.
    touched: set[Scope] = field(default_factory=set)

    def result(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "facts_consolidated": self.facts,
            "facts_failed": self.failed,
            "observations_created": self.created,
            "observations_updated": self.updated,
            "observations_merged": self.merged,
            "observation_conflicts": self.conflicts,
            "llm_retries": self.llm_retries,
            "llm_failures": self.llm_failures,
            "errors": self.errors[-5:],
        }


@dataclass(slots=True)
class _Rounds:
    """A batch's rounds: ``(scope, facts)`` pieces, and the seqs of facts in no scope."""

    work: list[tuple[Scope, list[StoredUnit]]]
    unscoped: list[int]


@dataclass(slots=True)
class _RunState:
    """What the rounds of one run share."""

    bank: Bank
    settings: BankSettings
    rule: ScopeRule
    provider: ChatProvider
    counters: _Counters
    versions: ObservationVersions = field(default_factory=ObservationVersions)
    #: Held around a round's settle and write, so rounds' writes never interleave.
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


def _counting(counters: _Counters) -> LlmObserver:
    """An observer counting a run's LLM retries and failures (shown in its journal and
    result, never silent)."""

    def retried(provider: str, status: int | None, reason: str, delay: float) -> None:
        counters.llm_retries += 1

    def failed(provider: str, status: int | None, reason: str) -> None:
        counters.llm_failures += 1

    return LlmObserver(on_retry=retried, on_failure=failed)


@dataclass(eq=False)
class Consolidation(BankRunService):
    """Starts, runs and stops the consolidation of banks (see the module docstring)."""

    KINDS: ClassVar[tuple[str, ...]] = (CONSOLIDATION_KIND,)

    provider: Callable[[], ChatProvider]
    llm_lane: Lane
    limits: ConsolidationLimits = field(default_factory=ConsolidationLimits)
    #: Scheduled starts, one per bank (a bank delete cancels its own).
    _scheduled: BankTimers = field(init=False)
    #: Called with the bank and the scopes (tag lists) whose observations a completed
    #: run changed (mental models' triggers); must return at once.
    after_consolidation: list[Callable[[Bank, list[list[str]]], None]] = field(
        init=False, default_factory=list
    )

    def __post_init__(self) -> None:
        self._scheduled = BankTimers(self.engine)
        super().__post_init__()
        self.engine.after_retain.append(self.schedule)

    def kind_spec(self) -> KindSpec:
        """How ``consolidation`` runs execute: register it as :data:`CONSOLIDATION_KIND`."""
        return KindSpec(execute=self._execute, max_attempts=MAX_ATTEMPTS)

    # -- starting ------------------------------------------------------------------------

    def schedule(self, bank: Bank) -> None:
        """Start a consolidation of *bank* after :attr:`ConsolidationLimits.debounce`
        seconds (a retain's hook: returns at once; one timer per bank)."""
        if self.engine.settings(bank).enable_observations:
            self._scheduled.start(bank.ref, lambda: self._start_later(bank))

    async def resume(self) -> int:
        """Schedule a consolidation of every bank that has units pending and keeps
        observations (at start-up: a run that ended ``interrupted`` at shutdown, or whose
        facts a restart left pending, is picked up without waiting for a retain). Across
        instances each bank still gets one run. How many banks were scheduled."""
        banks = await run_in_thread(self.engine.store.banks_with_pending, RESUME_LIMIT)
        scheduled = 0
        for bank in banks:
            if self.engine.settings(bank).enable_observations and not self._scheduled.running(
                bank.ref
            ):
                self.schedule(bank)
                scheduled += 1
        return scheduled

    async def _start_later(self, bank: Bank) -> None:
        """Submit after the debounce; while another run of the bank is busy, look again
        later, until a run is admitted or nothing is pending. A failure to submit (the
        database unreachable) is logged and ends the timer: the next retain, ``POST
        .../consolidate`` or start-up schedules again."""
        with contextlib.suppress(OperationCancelled, NotFound):
            try:
                while True:
                    await asyncio.sleep(self.limits.debounce)
                    _, deduplicated = await self.submit(bank)
                    if not deduplicated:
                        return
                    pending = await run_in_thread(self.engine.store.pending_units, bank.ref, 1)
                    if not pending:
                        return
            except Exception as exc:
                reraise_cancellation(exc)
                log.warning(
                    "consolidation of bank %s could not start: %s", bank.bank_id, exc, exc_info=exc
                )

    async def submit(self, bank: Bank, scopes: ScopeRule | None = None) -> tuple[Run | None, bool]:
        """Start a consolidation of *bank* unless one is busy: ``(run, deduplicated)``, the
        busy run with ``True`` when there was one (whatever scope rule it was given).
        *scopes* is the run's scope rule (:mod:`heed.memory.learning.scopes`; ``None``: the bank's
        default)."""
        run = await self.manager.submit(
            CONSOLIDATION_KIND,
            tenant=bank.tenant,
            session_id=bank_session(bank),
            payload={**bank_payload(bank), "observation_scopes": scopes},
            summary={"bank_id": bank.bank_id},
            strategy="idle",
        )
        if run is not None:
            return run, False
        busy = await self.manager.io.call(
            lambda: self.manager.store.list_runs(
                tenant=bank.tenant,
                session_id=bank_session(bank),
                kind=CONSOLIDATION_KIND,
                non_terminal=True,
                limit=1,
            )
        )
        return (busy[0] if busy else None), True

    async def recover(self, bank: Bank) -> int:
        """Make the bank's failed units pending again and schedule a consolidation."""
        count = await run_in_thread(self.engine.store.recover_consolidation, bank.ref)
        if count:
            self.schedule(bank)
        return count

    async def clear(self, bank: Bank, source_id: str | None = None) -> int:
        """Delete the bank's observations (those resting on memory *source_id* when given;
        :class:`NotFound` when the bank has no such memory); the facts they rested on
        become pending again. How many were deleted."""
        async with self.engine.track(bank):
            if source_id is not None:
                await self.engine.get_unit(bank, source_id)
            result = await run_in_thread(self.engine.store.delete_observations, bank.ref, source_id)
            await run_in_thread(self.engine.indexes.apply, bank.ref, result, None)
        return len(result.removed)

    async def aclose(self) -> None:
        """Stop the timers of scheduled starts (runs are the manager's)."""
        await self._scheduled.aclose()

    # -- running -------------------------------------------------------------------------

    async def _execute(self, rc: RunContext) -> dict[str, Any]:
        async with bank_run(self.engine, rc) as bank:
            rc.token.set_deadline(time.monotonic() + self.limits.max_seconds)
            settings = self.engine.settings(bank)
            rule = scope_rule(rc.payload.get("observation_scopes"), settings)
            counters = _Counters()
            provider = self.provider()
            width = call_concurrency(provider, background=True)
            run = _RunState(bank, settings, rule, provider, counters)
            async with self.engine.track(bank):
                with (
                    observing(_counting(counters)),
                    llm_work(bank.tenant, bank.bank_id, "consolidation", background=True),
                ):
                    while True:
                        raise_if_cancelled()
                        # While an asynchronous retain still writes into the bank, only
                        # whole rounds: the rest waits for its next document.
                        retains = self.engine.retains
                        writes = retains.writes(bank.ref)
                        whole = retains.writing(bank.ref)
                        # Enough for a few rounds per slot: rounds start as slots free
                        # up, with no barrier between one set of rounds and the next.
                        batch = await run_in_thread(
                            self.engine.store.pending_units,
                            bank.ref,
                            self.limits.batch * (width * ROUNDS_PER_SLOT if width > 1 else 1),
                        )
                        rounds = self._rounds(batch, rule, whole)
                        if not rounds.work and not rounds.unscoped:
                            if not whole:
                                break
                            await retains.wait(bank.ref, writes, RETAIN_WAIT_SECONDS)
                            continue
                        if rounds.unscoped:  # in no scope of the rule: nothing to observe
                            changes = ObservationChanges(done=rounds.unscoped)
                            await run_in_thread(self._write, bank, changes, [])
                            counters.facts += len(rounds.unscoped)
                        await run_all(
                            [
                                partial(self._round, run, scope, facts)
                                for scope, facts in rounds.work
                            ],
                            width,
                        )
                        counters.rounds += len(rounds.work)
                        await rc.emit(
                            EventType.PROGRESS,
                            {"processed": counters.facts + counters.failed, **counters.result()},
                        )
        if counters.touched:
            scopes = [list(scope) for scope in sorted(counters.touched)]
            for hook in self.after_consolidation:
                hook(bank, scopes)
        return counters.result()

    def _rounds(self, batch: list[StoredUnit], rule: ScopeRule, whole: bool) -> _Rounds:
        """*batch* cut into rounds: each scope's facts in pieces of at most
        :attr:`ConsolidationLimits.batch`, oldest first (only full pieces when *whole*), and
        the facts in no scope of the rule (consolidated, with nothing to observe)."""
        groups: dict[Scope, list[StoredUnit]] = {}
        unscoped: list[int] = []
        for unit in batch:
            scopes = scopes_of(unit.tags, rule)
            for scope in scopes:
                groups.setdefault(scope, []).append(unit)
            if not scopes:
                unscoped.append(unit.seq)
        size = self.limits.batch
        work = [
            (scope, facts[i : i + size])
            for scope, facts in groups.items()
            for i in range(0, len(facts), size)
            if not whole or i + size <= len(facts)
        ]
        return _Rounds(work, unscoped)

    async def _round(self, run: _RunState, scope: Scope, facts: list[StoredUnit]) -> None:
        """One scope's round: its related observations, one model call, one write. Runs
        beside the run's other rounds (:mod:`heed.memory.learning.observations`)."""
        bank, counters = run.bank, run.counters
        since = run.versions.mark()
        related = await self._related(bank, facts, list(scope))
        messages = _prompt(facts, related, mission_for(scope, run.settings))
        try:
            async with model_slot(run.provider, self.llm_lane, background=True):
                reply = await complete_json(run.provider, messages, _FORMAT)
        except BadModelOutput as exc:
            counters.failed += len(facts)
            counters.errors.append(str(exc)[:300])
            await run_in_thread(
                self._write, bank, ObservationChanges(failed=[f.seq for f in facts]), []
            )
            return
        actions = plan_actions(reply.value, scope, facts, related)
        fresh = [action.unit for action in actions]
        await self.engine.embed(fresh, background=True)
        async with run.writing:
            settled = run.versions.settle(actions, since, [f.seq for f in facts])
            await run_in_thread(self._write, bank, settled.changes, settled.fresh)
        counters.facts += len(facts)
        counters.created += settled.created
        counters.updated += settled.updated
        counters.merged += settled.merged
        counters.conflicts += settled.conflicts
        if actions:
            counters.touched.add(scope)

    async def _related(
        self, bank: Bank, facts: list[StoredUnit], tags: list[str]
    ) -> list[StoredUnit]:
        """The observations related to *facts* in their scope, best first, deduplicated:
        at most :data:`RELATED_QUERIES` recalls, each with the text of a few facts (a
        round's background CPU stays small beside users' recalls)."""
        seen: dict[str, StoredUnit] = {}
        queries = min(RELATED_QUERIES, len(facts))
        per_query = max(2, self.limits.related // max(1, queries))
        for number in range(queries):
            group = facts[number::queries]  # every queries-th fact: a few, spread over the batch
            share = QUERY_CHARS // len(group)
            query = RecallQuery(
                query=" ".join(f.text[:share] for f in group),
                types=["observation"],
                budget="low",
                max_tokens=2048,
                tags=tags or None,
                tags_match="all_strict" if tags else "any",
            )
            outcome = await self.engine.recall(bank, query, background=True)
            for hit in outcome.hits[:per_query]:
                seen.setdefault(hit.unit.id, hit.unit)
            if len(seen) >= self.limits.related:
                break
        ids = list(seen)[: self.limits.related]
        # Recall's units lack provenance and history: read the rows themselves.
        return await run_in_thread(self.engine.store.units_by_ids, bank.ref, ids)

    def _write(self, bank: Bank, changes: ObservationChanges, fresh: list[PreparedUnit]) -> None:
        raise_if_cancelled()
        result = self.engine.store.write_observations(bank.ref, changes)
        self.engine.indexes.apply(bank.ref, result, loose_units(fresh))


def _prompt(
    facts: list[StoredUnit], related: list[StoredUnit], mission: str | None
) -> list[ChatMessage]:
    system = _INSTRUCTIONS + (f" What to observe: {mission}" if mission else "")
    lines = ["New facts:"]
    for number, fact in enumerate(facts):
        when = f" ({fact.occurred_start[:10]})" if fact.occurred_start else ""
        lines.append(f"F{number}{when}: {fact.text}")
    lines.append("Existing observations:" if related else "Existing observations: none")
    for number, observation in enumerate(related):
        lines.append(f"O{number}: {observation.text}")
    return [ChatMessage.system(system), ChatMessage.user("\n".join(lines))]
