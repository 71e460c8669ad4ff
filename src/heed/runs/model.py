"""The run model: what a run is, its phases, and which phase changes are allowed.

A *run* is one long piece of work: a chat turn, a background task, an async
retain, a streamed reflect. Every run has a row in the run registry
(:class:`~heed.runs.store.RunStore`) and a journal of events
(:class:`RunEvent`, gap-free ``seq`` from 1).

Phases::

    queued -> running -> completed | failed
    queued -> cancelled                     (cancelled before it started; never starts)
    running -> cancelling -> cancelled      (token cancelled; the worker unwinds)
    queued | running | cancelling -> interrupted   (the worker died: restart, lost lease)
    running -> queued                       (requeued: the worker died and the run's kind
                                             has max_attempts left; attempts += 1)
    running -> failed                       (quarantined: its worker died max_attempts times)

What becomes of a run whose worker died is decided in one place,
:func:`heed.runs.state.ending_for_lost_worker`: a kind without ``max_attempts``
(:class:`~heed.runs.kinds.KindSpec`) is ``interrupted`` and never re-run; a kind with
it goes back to ``queued`` (``attempts`` counts the deaths) until the death that
would reach ``max_attempts``, which *quarantines* it: ``failed`` with an error
starting ``quarantined`` (:func:`heed.runs.state.is_quarantined`), never claimed
again. A ``cancelling`` run whose worker died is always ``cancelled``.

Terminal phases (``cancelled``, ``completed``, ``failed``, ``interrupted``) are
absorbing: the store only writes a phase with a guarded update
``WHERE phase IN (<allowed sources>)``, and no terminal phase is an allowed
source of anything. ``phase`` is kept as the raw stored string on
:class:`Run` so that readers meet unknown or blank values (a newer writer, a
hand-edited row) through the predicates in :mod:`heed.runs.state`, which handle
them, instead of crashing on parse.

Times are wall-clock epoch seconds (``time.time()``): they are compared across
processes that share one database.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from heed.runs.events import TERMINAL_EVENT_TYPES

__all__ = [
    "MAX_SUMMARY_BYTES",
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_PHASES",
    "TRANSITIONS",
    "Phase",
    "Run",
    "RunEvent",
    "Source",
    "allowed_sources",
    "new_run_id",
    "parse_phase",
    "summary_json",
]


class Phase(StrEnum):
    """The phases of a run (see the module docstring for the graph)."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class Source(StrEnum):
    """Who asked for a run: a user, a wakeup after a background task, or an API client."""

    USER = "user"
    WAKEUP = "wakeup"
    API = "api"


TERMINAL_PHASES: Final = frozenset(
    {Phase.CANCELLED, Phase.COMPLETED, Phase.FAILED, Phase.INTERRUPTED}
)

#: For each phase, the phases it may move to. Terminal phases move nowhere.
TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.QUEUED: frozenset({Phase.RUNNING, Phase.CANCELLED, Phase.FAILED, Phase.INTERRUPTED}),
    # running -> queued: a requeue after the worker died (only for kinds with max_attempts).
    Phase.RUNNING: frozenset(
        {Phase.QUEUED, Phase.CANCELLING, Phase.COMPLETED, Phase.FAILED, Phase.INTERRUPTED}
    ),
    Phase.CANCELLING: frozenset({Phase.CANCELLED, Phase.INTERRUPTED}),
    Phase.CANCELLED: frozenset(),
    Phase.COMPLETED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.INTERRUPTED: frozenset(),
}


def allowed_sources(target: Phase) -> frozenset[Phase]:
    """The phases from which a run may move to *target* (``queued``: only from ``running``,
    a requeue)."""
    return frozenset(p for p, targets in TRANSITIONS.items() if target in targets)


def parse_phase(value: object) -> Phase | None:
    """The :class:`Phase` named by *value* (trimmed, case-insensitive), or ``None``.

    ``None`` means unknown or blank; callers must treat that explicitly (the
    predicates in :mod:`heed.runs.state` do).
    """
    if isinstance(value, Phase):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    try:
        return Phase(text)
    except ValueError:
        return None


#: The largest :attr:`Run.summary`, as compact JSON (UTF-8 bytes).
MAX_SUMMARY_BYTES: Final = 4096


def summary_json(summary: dict[str, Any]) -> str:
    """*summary* as the compact JSON the store keeps; ``ValueError`` past
    :data:`MAX_SUMMARY_BYTES` (a kind that summarises its input too generously is a bug:
    the summary is read by every listing)."""
    text = json.dumps(summary, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > MAX_SUMMARY_BYTES:
        raise ValueError(
            f"a run summary is {len(text.encode())} bytes; at most {MAX_SUMMARY_BYTES}"
        )
    return text


def new_run_id() -> str:
    """A fresh run id (``run_`` + 24 hex digits)."""
    return "run_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True, slots=True)
class Run:
    """One row of the run registry (immutable snapshot; the store holds the truth).

    The run's input (its *payload*: a turn's message, a retain's items, up to the
    body limit) is not part of the row: the store keeps it apart and only the
    worker that executes the run reads it (:meth:`~heed.runs.store.RunStore.payload`),
    so listings, the reaper and admission never load it. ``summary`` is what
    readers see of it instead: a small JSON object the run's kind chooses (at most
    :data:`MAX_SUMMARY_BYTES` as JSON), e.g. a retain's item count and its
    idempotency key. ``result`` is the output once finished; both are owned by the
    run's kind. ``last_seq`` is the journal's highest seq (0 when empty) and
    ``first_seq`` the lowest still retained (1 unless trimmed);
    ``journal_closed`` is true once a terminal event was appended. ``attempts``
    counts the times a worker died while running it and it was requeued (or, the
    last time, quarantined); only kinds with ``max_attempts`` ever count one.
    """

    id: str
    kind: str
    tenant: str
    phase: str
    created_at: float
    session_id: str | None = None
    source: str = Source.API
    started_at: float | None = None
    cancelled_at: float | None = None
    finished_at: float | None = None
    cancel_reason: str | None = None
    error: str | None = None
    worker_id: str | None = None
    lease_expires_at: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    last_seq: int = 0
    first_seq: int = 1
    journal_closed: bool = False
    attempts: int = 0

    @property
    def phase_enum(self) -> Phase | None:
        """The parsed phase, or ``None`` when unknown or blank."""
        return parse_phase(self.phase)

    def to_public(self) -> dict[str, Any]:
        """The JSON shape the HTTP API returns."""
        data = asdict(self)
        data["object"] = "run"
        return data


@functools.lru_cache(maxsize=4096)
def _json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


class RunEvent:
    """One journal event: ``seq`` is gap-free from 1 within its run.

    Treated as immutable. ``data`` is a JSON object; an event read back from the
    store keeps the stored JSON text (:attr:`data_json`) and parses it only when
    ``data`` is first read, so replaying a long journal to a stream never
    decodes and re-encodes every payload.
    """

    __slots__ = ("_data", "_data_json", "run_id", "seq", "ts", "type")

    def __init__(
        self,
        run_id: str,
        seq: int,
        type: str,
        data: dict[str, Any] | None = None,
        ts: float = 0.0,
        *,
        data_json: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.seq = seq
        self.type = type
        self.ts = ts
        self._data = data if data is not None or data_json is not None else {}
        self._data_json = data_json

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            value = json.loads(self._data_json or "{}")
            self._data = value if isinstance(value, dict) else {"value": value}
        return self._data

    @property
    def data_json(self) -> str:
        """``data`` as compact JSON text."""
        if self._data_json is None:
            self._data_json = json.dumps(self._data, separators=(",", ":"), ensure_ascii=False)
        return self._data_json

    @property
    def is_terminal(self) -> bool:
        """True when this event ends the journal."""
        return self.type in TERMINAL_EVENT_TYPES

    def to_public(self) -> dict[str, Any]:
        """The JSON shape of an event on the wire."""
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "type": self.type,
            "ts": self.ts,
            "data": self.data,
        }

    def to_json(self) -> str:
        """:meth:`to_public` as compact JSON, without re-encoding a stored payload."""
        run_id = _json_string(self.run_id)
        type_ = _json_string(self.type)
        ts = repr(float(self.ts))  # what json.dumps writes for a finite float
        head = f'{{"run_id":{run_id},"seq":{self.seq},"type":{type_},"ts":{ts}'
        return f'{head},"data":{self.data_json}}}'

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunEvent):
            return NotImplemented
        return (self.run_id, self.seq, self.type, self.ts, self.data) == (
            other.run_id,
            other.seq,
            other.type,
            other.ts,
            other.data,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RunEvent({self.run_id!r}, {self.seq}, {self.type!r}, {self.data!r}, {self.ts})"
