"""What each LLM call was for and what it cost: the work it serves, its record, who is told.

**The work.** A domain says what its model calls are for with :func:`llm_work`::

    with llm_work(bank.tenant, bank.bank_id, "consolidation"):
        reply = await complete_json(provider, messages, schema)

*kind* is one of :data:`KINDS`. Blocks nest; the **outermost kind wins** (a mental-model
refresh is a reflect: its calls count as ``mental_model_refresh``), and an inner block
fills a bank the outer one left out. ``background=True`` says nobody waits on the calls
(a consolidation, a refresh, an asynchronous retain's extraction): they yield to users'
calls at a provider's concurrency limit (:mod:`heed.llm.gate`) and count against the
bank's budget (:mod:`heed.llm.budget`); a block inside background work is background too.

**The record.** Every provider :func:`heed.llm.factory.build_provider` builds is wrapped
in :class:`heed.llm.metered.MeteredProvider`, which turns each call into one
:class:`LlmCall` (times, provider, model, status, tokens, the messages and the reply) and
hands it to every sink added with :func:`add_call_sink`, synchronously, in the calling
context. Tokens are the provider's reported usage when it reported any, else a count of
the prompt's and the reply's text by the counter set with :func:`use_token_counter` (the
composition root sets heed's tokenizer; without one, about four characters a token),
with ``usage_reported`` false. The call is also added to the context's run tally
(:mod:`heed.runtime.tally`).

A sink that raises is logged and ignored: recording a call never breaks it. A call's times
are read from :func:`wall_clock` (epoch seconds), the clock budgets count windows by too; a
benchmark moves it with :func:`use_wall_clock`.

**Admission.** Before a call starts, every admission added with :func:`add_call_admission`
is entered (an async context manager given the work, the messages and the reply's cap) and
held until the call has ended and been recorded: the composition root adds the banks'
budgets (:mod:`heed.llm.budget`), which may hold a background call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from heed.llm.base import ChatMessage, ToolCall
from heed.llm.hooks import Hooks
from heed.runtime import reraise_cancellation

__all__ = [
    "KINDS",
    "STATUSES",
    "CallSink",
    "LlmCall",
    "LlmWork",
    "add_call_admission",
    "add_call_sink",
    "admitted",
    "count_tokens",
    "current_work",
    "llm_work",
    "notify_call",
    "remove_call_admission",
    "remove_call_sink",
    "use_token_counter",
    "use_wall_clock",
    "wall_clock",
]

log = logging.getLogger("heed.llm")

KINDS: Final = (
    "reflect",
    "turn",
    "extraction",
    "consolidation",
    "mental_model_refresh",
    "other",
)
"""The kinds of work an LLM call is counted under (``other``: no :func:`llm_work` said)."""

STATUSES: Final = ("success", "error", "cancelled")
"""How a call ended: it finished (or its consumer stopped early), a provider error, a cancel."""


@dataclass(frozen=True, slots=True)
class LlmWork:
    """What the calls of a context are for: a tenant's bank (if any), a kind of work, and
    whether it is background work (nobody waits on it)."""

    tenant: str | None
    bank_id: str | None
    kind: str
    background: bool = False


_work: ContextVar[LlmWork | None] = ContextVar("heed_llm_work", default=None)


@contextlib.contextmanager
def llm_work(
    tenant: str | None, bank_id: str | None, kind: str, *, background: bool = False
) -> Iterator[LlmWork]:
    """Count the LLM calls of this block as *kind* of work for *bank_id* (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of LLM work {kind!r}; expected one of {KINDS}")
    outer = _work.get()
    work = LlmWork(tenant, bank_id, kind, background)
    if outer is not None:
        work = LlmWork(
            outer.tenant or tenant,
            outer.bank_id or bank_id,
            outer.kind if outer.kind != "other" else kind,
            outer.background or background,
        )
    reset = _work.set(work)
    try:
        yield work
    finally:
        _work.reset(reset)


def current_work() -> LlmWork | None:
    """The work the calls of this context are for, or ``None`` when nobody said."""
    return _work.get()


@dataclass(frozen=True, slots=True)
class LlmCall:
    """One LLM call as it ended (see the module docstring).

    ``kind`` is the work it served (one of :data:`KINDS`). ``started_at`` and ``ended_at``
    are epoch seconds. ``error`` holds a provider error's message; ``trace_id`` is the run
    the call was made in, if any.
    """

    id: str
    tenant: str | None
    bank_id: str | None
    kind: str
    provider: str
    model: str
    status: str
    started_at: float
    ended_at: float
    prompt_tokens: int
    completion_tokens: int
    usage_reported: bool
    messages: Sequence[ChatMessage]
    reply: str
    tool_calls: Sequence[ToolCall] = ()
    error: str | None = None
    finish_reason: str | None = None
    trace_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> int:
        return max(0, round((self.ended_at - self.started_at) * 1000))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


CallSink = Callable[[LlmCall], None]

_sinks: Hooks[CallSink] = Hooks()


def add_call_sink(sink: CallSink) -> None:
    """Hand every LLM call of this process to *sink* from now on."""
    _sinks.add(sink)


def remove_call_sink(sink: CallSink) -> None:
    """Stop handing calls to *sink*; no-op if it was not added."""
    _sinks.remove(sink)


def notify_call(call: LlmCall) -> None:
    """Hand *call* to every sink (in the order they were added)."""
    for sink in _sinks.snapshot():
        try:
            sink(call)
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("an LLM call sink failed")


def _estimate(text: str) -> int:
    return (len(text) + 3) // 4


_counter: list[Callable[[str], int]] = [_estimate]


def use_token_counter(counter: Callable[[str], int] | None) -> None:
    """Count tokens with *counter* when a provider reports no usage (``None``: the estimate)."""
    _counter[0] = counter or _estimate


def count_tokens(text: str) -> int:
    """*text*'s tokens by the counter in use (0 for no text)."""
    if not text:
        return 0
    try:
        return int(_counter[0](text))
    except Exception as exc:
        reraise_cancellation(exc)
        log.exception("the token counter failed; estimating")
        return _estimate(text)


CallAdmission = Callable[
    [LlmWork | None, Sequence[ChatMessage], int | None], AbstractAsyncContextManager[None]
]

_admissions: Hooks[CallAdmission] = Hooks()


def add_call_admission(admission: CallAdmission) -> None:
    """Enter *admission* around every LLM call of this process from now on."""
    _admissions.add(admission)


def remove_call_admission(admission: CallAdmission) -> None:
    """Stop entering *admission*; no-op if it was not added."""
    _admissions.remove(admission)


@contextlib.asynccontextmanager
async def admitted(messages: Sequence[ChatMessage], max_tokens: int | None) -> AsyncIterator[None]:
    """Hold a call until every admission lets it start, and until it ended (see the module
    docstring). Raises what an admission raises (a cancelled wait: ``OperationCancelled``)."""
    admissions = _admissions.snapshot()
    work = _work.get()
    async with contextlib.AsyncExitStack() as stack:
        for admission in admissions:
            await stack.enter_async_context(admission(work, messages, max_tokens))
        yield


_clock: list[Callable[[], float]] = [time.time]


def wall_clock() -> float:
    """Now, in epoch seconds, as LLM calls are timed and budgets count (``time.time``
    unless :func:`use_wall_clock` set another)."""
    return _clock[0]()


def use_wall_clock(clock: Callable[[], float] | None) -> None:
    """Time calls and budgets by *clock* (``None``: ``time.time`` again). For benchmarks
    that let a day pass in a minute; the server never calls it."""
    _clock[0] = clock or time.time
