"""The session store interface: sessions, their transcripts, and pending wakeups.

The SQLite implementation is :class:`heed.storage.session_store.SqlSessionStore`.
Calls are blocking and short. Calls made inside
:meth:`heed.runs.store.RunStore.transaction` (same database, same thread) join
that transaction, which is how a wakeup is recorded atomically with the end of
the task run that caused it, and marked delivered atomically with the
admission of the turn that delivers it.

Promises:

- a message's ``idx`` is gap-free per session from 0 (transcript order);
- :meth:`SessionStore.add_wakeup` is idempotent per task run (never doubled);
- :meth:`SessionStore.mark_delivered` only claims wakeups not yet delivered and
  returns how many it claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ["Message", "Session", "SessionStore", "Wakeup"]


@dataclass(frozen=True, slots=True)
class Session:
    """A chat session, optionally bound to a memory bank."""

    id: str
    tenant: str
    title: str
    bank_id: str | None
    created_at: float
    updated_at: float
    #: Each user message of a turn is retained into the session's bank (off by default).
    remember_messages: bool = False

    def to_public(self) -> dict[str, Any]:
        return {**asdict(self), "object": "session"}


@dataclass(frozen=True, slots=True)
class Message:
    """One transcript entry. ``status``: ``complete``, ``cancelled`` or ``interrupted``
    (partial assistant output of a turn that did not finish)."""

    id: str
    session_id: str
    idx: int
    role: str
    content: str
    created_at: float
    run_id: str | None = None
    status: str = "complete"
    source: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def to_public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A finished background task the session has (or has not yet) been told about."""

    id: str
    session_id: str
    task_run_id: str
    summary: dict[str, Any]
    created_at: float
    delivered_run_id: str | None = None


class SessionStore(Protocol):
    """See the module docstring."""

    def migrate(self) -> None: ...

    def create(self, session: Session) -> Session: ...

    def get(self, session_id: str) -> Session | None: ...

    def list_sessions(self, tenant: str, limit: int = 100) -> list[Session]: ...

    def update(
        self,
        session_id: str,
        *,
        title: str | None = None,
        remember_messages: bool | None = None,
    ) -> Session | None:
        """Change the given fields (and ``updated_at``); ``None`` if unknown."""
        ...

    def delete(self, session_id: str) -> bool:
        """Delete the session, its transcript and its wakeups; False if unknown."""
        ...

    def append_message(self, message: Message) -> Message:
        """Append at the next ``idx`` (the given ``idx`` is ignored); returns it as stored."""
        ...

    def messages(self, session_id: str) -> list[Message]: ...

    def add_wakeup(self, wakeup: Wakeup) -> bool:
        """Record a wakeup; False if one exists for that task run already."""
        ...

    def pending_wakeups(self, session_id: str | None = None) -> list[Wakeup]: ...

    def mark_delivered(self, wakeup_ids: Sequence[str], run_id: str) -> int: ...
