"""The run registry and journal storage interface (:class:`RunStore`).

Stable interface for every kind of run (turns, background tasks, async retain,
streamed reflect). The SQLite implementation is
:class:`heed.storage.run_store.SqlRunStore`; a PostgreSQL one can be added
beside it. All methods are blocking and short (indexed reads, one small write
transaction); async code reaches them through the run manager's I/O executor.

Promises every implementation keeps:

- **Guarded phase writes.** :meth:`RunStore.transition` updates a row only
  ``WHERE phase IN (allowed sources of the target)`` (see
  :data:`heed.runs.model.TRANSITIONS`), so terminal phases are absorbing and two
  racing writers cannot both win. It returns ``None`` when the guard refused.
- **Journal.** :meth:`RunStore.append_events` assigns gap-free integer ``seq``
  starting at 1, in the same transaction that bumps the run's ``last_seq``;
  nothing is appended after a terminal event (the journal is *closed*), in
  which case it returns ``[]``. A terminal event passed to ``transition`` is
  appended in the same transaction as the phase change, or not at all.
- **Atomic admission.** :meth:`RunStore.admit` and :meth:`RunStore.claim` run
  their check-and-write in one write transaction that excludes other writers
  (also in other processes sharing the database), so two concurrent starts
  never both pass the check.
- :meth:`RunStore.transaction` is a unit of work: store calls made inside it
  (in the same thread) join it and commit or roll back together.
- **Payloads apart.** A run's input (up to the body limit: a retain's items) is
  stored beside its registry row, written with it (``create``, ``admit``) and read
  only by :meth:`RunStore.payload`. Every other read -- ``get``, ``list_runs``,
  ``runs_in_phases``, ``claim``, ``transition`` -- returns rows without it (their
  :attr:`~heed.runs.model.Run.summary` instead), so a listing, the reaper or an
  admission costs the same whatever the runs carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from heed.runs.model import Phase, Run, RunEvent

__all__ = ["BlockingCheck", "ClaimCheck", "RunStore", "Transition"]

#: ``blocking(siblings) -> run that blocks admission, or None``.
BlockingCheck = Callable[[Sequence[Run]], Run | None]
#: ``may_start(run, siblings) -> bool`` for :meth:`RunStore.claim`.
ClaimCheck = Callable[[Run, Sequence[Run]], bool]


@dataclass(frozen=True, slots=True)
class Transition:
    """The outcome of a successful guarded transition: the new row and the event
    appended with it (``None`` when none was asked for or the journal was closed)."""

    run: Run
    event: RunEvent | None


class RunStore(Protocol):
    """Durable run registry plus per-run append-only journal. See the module docstring."""

    def migrate(self) -> None:
        """Bring the schema to the current version (idempotent)."""
        ...

    def transaction(self) -> AbstractContextManager[object]:
        """A write unit of work; store calls inside it (same thread) join it."""
        ...

    # -- registry ------------------------------------------------------------------

    def create(self, run: Run, payload: Mapping[str, Any] | None = None) -> Run:
        """Insert a new run (its id must be new) with its *payload*; returns it as stored."""
        ...

    def delete_terminal(self, run_id: str) -> bool:
        """Remove a terminal run with its journal and payload, in one transaction; whether
        it was removed (``False``: no such run, or it has not ended)."""
        ...

    def payload(self, run_id: str) -> dict[str, Any] | None:
        """The run's input as submitted (``{}`` when it had none); ``None`` when the run is
        unknown. For the worker that executes the run: nothing else needs it."""
        ...

    def get(self, run_id: str) -> Run | None:
        """The run, or ``None`` when unknown."""
        ...

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        session_id: str | None = None,
        kind: str | None = None,
        phases: Iterable[str] | None = None,
        non_terminal: bool = False,
        summary_equals: Mapping[str, str] | None = None,
        newest_first: bool = False,
        offset: int = 0,
        limit: int = 1000,
        with_result: bool = True,
    ) -> list[Run]:
        """Runs matching every given filter, oldest first (``newest_first``: the reverse),
        skipping *offset*, at most *limit*.

        ``non_terminal=True`` returns rows whose phase is not terminal,
        including unknown or blank phases. ``summary_equals`` keeps runs whose summary
        has each given key set to the given string. ``with_result=False`` leaves every
        ``result`` ``None`` (not read: a listing that does not show it).
        """
        ...

    def runs_in_phases(
        self, phases: Iterable[str], *, after_id: str = "", limit: int = 500
    ) -> list[Run]:
        """Runs in *phases* whose id sorts after *after_id*, by id, at most *limit*: one
        bounded batch of a scan (pass the last id of a batch to get the next)."""
        ...

    def count_runs(
        self, *, tenant: str | None = None, session_id: str | None = None, kind: str | None = None
    ) -> dict[str, int]:
        """How many runs match, per stored phase string (unknown phases included)."""
        ...

    def transition(
        self,
        run_id: str,
        to: Phase,
        *,
        fields: Mapping[str, Any] | None = None,
        event: tuple[str, Mapping[str, Any]] | None = None,
        only_from: Iterable[Phase] | None = None,
        worker_id: str | None = None,
    ) -> Transition | None:
        """Move *run_id* to *to* if its phase is an allowed source (narrowed by *only_from*,
        and by ``worker_id`` ownership when given); set *fields*; append *event* in the
        same transaction. ``None`` when the guard refused (nothing written)."""
        ...

    def admit(
        self,
        run: Run,
        blocking: BlockingCheck,
        *,
        scope_kinds: Iterable[str],
        payload: Mapping[str, Any] | None = None,
    ) -> tuple[Run | None, Run | None]:
        """Atomically: load the non-terminal runs of ``run.session_id`` whose kind is in
        *scope_kinds*; if ``blocking(siblings)`` names one, insert nothing and return
        ``(None, blocker)``; else insert *run* with its *payload* and return ``(run as
        stored, None)``. An exception ``blocking`` raises rolls the admission back and
        propagates. The stored ``created_at`` is taken under the lock and after every
        sibling's, so within a session it orders runs as they were admitted."""
        ...

    def claim(
        self,
        run_id: str,
        *,
        worker_id: str,
        lease_seconds: float,
        may_start: ClaimCheck,
        scope_kinds: Iterable[str],
    ) -> tuple[Run, RunEvent] | None:
        """Atomically move a ``queued`` run to ``running`` (with worker and lease, and a
        ``started`` journal event) if ``may_start(run, siblings)``; else ``None``.
        ``started_at`` is read from the clock once the write lock is held, and the
        lease runs *lease_seconds* from then."""
        ...

    def renew_leases(self, worker_id: str, run_ids: Sequence[str], until: float) -> list[Run]:
        """Extend the lease of the non-terminal runs in *run_ids* owned by *worker_id*;
        returns those rows (callers notice phases changed by other processes)."""
        ...

    def cancel_requests(self, run_ids: Sequence[str]) -> dict[str, str]:
        """Of *run_ids*, those in phase ``cancelling``, each with its cancel reason (one
        indexed query: the cancel watch asks it every few tens of milliseconds)."""
        ...

    # -- journal -------------------------------------------------------------------

    def append_events(
        self, run_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[RunEvent]:
        """Append events in order with the next seqs; ``[]`` if the journal is closed
        or the run is unknown. A terminal event closes the journal (later ones in the
        same call are dropped)."""
        ...

    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        """``last_seq`` of each known run of *run_ids* (unknown ones are left out)."""
        ...

    def events_after(self, run_id: str, after: int, limit: int = 1000) -> list[RunEvent]:
        """Retained events with ``seq > after``, in order, at most *limit*."""
        ...

    def last_event(self, run_id: str, event_type: str) -> RunEvent | None:
        """The run's retained event of *event_type* with the highest seq, if any."""
        ...

    def trim_journal(self, run_id: str, keep_from_seq: int) -> int:
        """Retention: delete events with ``seq < keep_from_seq``; returns how many.
        Readers whose cursor falls before the retained range get an explicit gap."""
        ...

    def finished_before(self, cutoff: float, limit: int = 1000) -> list[Run]:
        """Terminal runs finished before *cutoff* that still retain more than their last
        event (retention candidates), oldest first; their ``result`` is not read."""
        ...
