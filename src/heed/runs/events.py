"""The vocabulary of journal events: one set of names and payloads for every kind of run.

A run's journal (:mod:`heed.runs.journal`) is what a client renders and what a resumed
stream replays, so every writer (turns, background tasks, retains, streamed reflects, the
run machinery itself) uses these names, and the web UI reads the same names from
``web/static/events.js`` (a test keeps the two equal). A new event type is added here
first.

Lifecycle events are written by the run machinery, never by an executor:

- ``started`` ``{worker_id}``: a worker claimed the run;
- ``requeued`` ``{attempt, reason}``: the run's worker died while running it and the run
  went back to the queue (only kinds with ``max_attempts``); ``attempt`` is the number of
  worker deaths so far (1 for the first). A ``started`` follows when a worker claims it
  again, and its executor runs from the start: a client rendering the run discards the
  work events of the lost attempt (or shows them as abandoned);
- the terminal events, after which nothing is appended: ``completed`` ``{result}``,
  ``failed`` ``{error, status?}``, ``cancelled`` ``{reason}``, ``interrupted`` ``{reason}``.

Work events are written by executors with :meth:`heed.runs.kinds.RunContext.emit`:

- ``user_message`` ``{text, source}``: the user's message that started a turn;
- ``text_delta`` ``{text, iteration?}``: model text as it arrives (``iteration``: which
  model call of a reflect it belongs to; a new iteration replaces the text so far);
- ``tool_call`` ``{id, name, arguments, iteration?}``: the model (or the agent) called a tool;
- ``tool_result`` ``{id, name, ok, content?, output?, iteration?}``: its result, as the
  text the model saw (``content``) and/or as structured ``output``;
- ``message`` ``{text, message_id?}``: the final text of a model answer (a turn's
  assistant message, a reflect's answer);
- ``progress`` ``{...}``: how far a long step is (a retain's ``processed``/``total``, a
  background task's ``title``/``action``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, NotRequired, TypedDict

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "EventType",
    "MessageData",
    "TextDeltaData",
    "ToolCallData",
    "ToolResultData",
]


class EventType(StrEnum):
    """Every journal event type (see the module docstring for payloads)."""

    STARTED = "started"
    REQUEUED = "requeued"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    USER_MESSAGE = "user_message"
    TEXT_DELTA = "text_delta"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    MESSAGE = "message"
    PROGRESS = "progress"


#: Journal event types that end a run's journal: nothing is appended after one.
TERMINAL_EVENT_TYPES: Final = frozenset(
    {EventType.COMPLETED, EventType.FAILED, EventType.CANCELLED, EventType.INTERRUPTED}
)


class TextDeltaData(TypedDict):
    text: str
    iteration: NotRequired[int]


class ToolCallData(TypedDict):
    id: str
    name: str
    arguments: dict[str, Any]
    iteration: NotRequired[int]


class ToolResultData(TypedDict):
    id: str
    name: str
    ok: bool
    content: NotRequired[str]
    output: NotRequired[dict[str, Any] | None]
    iteration: NotRequired[int]


class MessageData(TypedDict):
    text: str
    message_id: NotRequired[str]
