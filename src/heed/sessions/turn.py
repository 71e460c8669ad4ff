"""The chat turn worker (runs of kind ``turn``).

One turn: the session's transcript plus the new user message go to the chat
provider with the tools of :mod:`heed.sessions.tools`; the provider's tokens,
tool calls, tool results and the final message go to the run's journal as
``token``, ``tool_call``, ``tool_result`` and ``message`` events, in order. The
transcript receives the user message when the turn starts, each assistant
message (with its tool calls) and tool result as it happens, and the final
assistant message at the end.

**Grounding.** In a session bound to a memory bank, a turn recalls before its first model
call (:meth:`TurnTools.ground <heed.sessions.tools.TurnTools.ground>`; the query is the
message and the names the user's previous one mentioned, so "and where does she work?"
still finds her). The
memories, with their dates, go right before the question in what this turn asks the model
(:func:`heed.llm.grounding.grounded_question`; the transcript keeps the message as
written), so a model that never calls a tool still answers from them; the recall and
retain tools stay offered. The recall is a tool step like any other: ``tool_call`` /
``tool_result`` in the journal, an assistant tool call and its result in the transcript,
cancellable at the recall's own checkpoints; its cost is in the turn's result
(``trace.grounding``, one entry per recall). Wakeup turns do not ground. A session with
``remember_messages`` then retains the user's message into its bank, as a ``retain`` tool
step (``trace.remembered``).

**Directives.** Every turn of a bank-bound session says the bank's active global
directives (:mod:`heed.memory.directives.rules`: the rules reflect says too, in the same words)
in its system prompt, or in the grounded answer's; their ids are in ``trace.directives``.
A bank deleted meanwhile has none.

**A model that cannot use tools** (``provider.follows_tools`` false: the embedded model)
gets the grounded answer reflect also gives (:class:`heed.llm.grounding.GroundedAnswer`):
each part of the message ("...'s cat and where does she work?" is two, each recalled on
its own) answered in one generation over its memories, without the earlier transcript (it
would repeat its last answer) and without tools; a part it refuses is followed by its best
memories, quoted, in the stream as in the stored message.

On cancel the partial assistant output is kept in the transcript with status
``cancelled`` (``interrupted`` when the server is shutting down) and
:class:`~heed.runtime.OperationCancelled` propagates. A turn whose process died
is finished by restart recovery, which rebuilds the partial output from the
journal and stores it with status ``interrupted`` (:meth:`TurnRunner.on_interrupted`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from heed.llm.base import (
    ChatMessage,
    ChatProvider,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSpec,
)
from heed.llm.grounding import GroundedAnswer, RecallPart, grounded_question
from heed.llm.metered import metered_stream
from heed.llm.spans import traced
from heed.llm.usage import llm_work
from heed.memory.directives.rules import Directive, rules_text
from heed.memory.entities import query_entity_names
from heed.memory.models import NotFound, StoredUnit
from heed.runs.ending import SHUTDOWN
from heed.runs.events import EventType
from heed.runs.io import BlockingIO
from heed.runs.kinds import RunContext
from heed.runs.model import Run, Source
from heed.runs.store import RunStore
from heed.runtime import OperationCancelled
from heed.sessions.store import Message, Session, SessionStore
from heed.sessions.tools import TOOL_SPECS, ToolResult, TurnTools, memory_lines

__all__ = ["SYSTEM_PROMPT", "TurnRunner", "turn_text"]

SYSTEM_PROMPT: Final = (
    "You are heed's assistant. You can search the user's memory bank with `recall`, store "
    "facts with `retain`, and start background work with `start_task`; you are woken when "
    "it completes. Answer briefly."
)


#: The tool-call id prefix of a turn's own recall (the run id follows: unique per turn).
GROUNDING_CALL_ID: Final = "call_ground"
#: Characters of the user's previous message added to the grounding query (when it names
#: nobody).
PREVIOUS_MESSAGE_CHARS: Final = 300


def _context_of(previous: str) -> str:
    """What of the user's previous message joins a turn's recall query: the names it
    mentions ("alice", so "and where does she work?" finds her), not its topic (the cat
    of "what is the name of Alice's cat?" would crowd out her work); its text when it names
    nobody."""
    names = query_entity_names(previous)
    return " ".join(names) if names else previous[:PREVIOUS_MESSAGE_CHARS]


#: ``directives(tenant, bank_id)``: the directives a turn of a session bound to the bank says.
DirectiveLookup = Callable[[str, str], Awaitable[list[Directive]]]


def _message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:20]


def turn_text(payload: Mapping[str, Any] | None) -> str:
    """The user-visible text a turn starts from (a user message, or a wakeup note), read
    from the turn's payload."""
    payload = payload or {}
    text = payload.get("content") or payload.get("message")
    if isinstance(text, str):
        return text
    return ""


def to_chat(messages: Sequence[Message]) -> list[ChatMessage]:
    """A transcript as provider messages (partial outputs included as said)."""
    chat: list[ChatMessage] = []
    for m in messages:
        if m.role == "user":
            chat.append(ChatMessage.user(m.content))
        elif m.role == "assistant":
            calls = [
                ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments") or {})
                for c in m.tool_calls
            ]
            chat.append(ChatMessage.assistant(m.content, calls))
        elif m.role == "tool" and m.tool_call_id:
            chat.append(ChatMessage.tool(m.tool_call_id, m.content, m.name))
    return chat


@dataclass(eq=False)
class TurnRunner:
    """Executes ``turn`` runs; register :meth:`execute` and :meth:`on_interrupted`."""

    sessions: SessionStore
    runs: RunStore
    io: BlockingIO
    provider: Callable[[], ChatProvider]
    tools: TurnTools
    _: KW_ONLY
    max_steps: int = 6
    max_tokens: int | None = None
    directives: DirectiveLookup | None = None

    async def _store(self, run: Run, role: str, content: str, **fields: Any) -> Message:
        assert run.session_id is not None
        message = Message(
            id=_message_id(),
            session_id=run.session_id,
            idx=0,
            role=role,
            content=content,
            created_at=time.time(),
            run_id=run.id,
            **fields,
        )
        return await self.io.call(self.sessions.append_message, message)

    async def execute(self, rc: RunContext) -> dict[str, Any]:
        """Run one turn; see the module docstring. Raises ``OperationCancelled`` on cancel."""
        run = rc.run
        assert run.session_id is not None
        session = await self.io.call(self.sessions.get, run.session_id)
        if session is None:
            raise LookupError(f"session {run.session_id} was deleted")
        history = await self.io.call(self.sessions.messages, run.session_id)
        with llm_work(run.tenant, session.bank_id, "turn"):
            return await self._turn(rc, session, history)

    async def _turn(
        self, rc: RunContext, session: Session, history: list[Message]
    ) -> dict[str, Any]:
        run = rc.run
        content = turn_text(rc.payload)
        await self._store(run, "user", content, source=run.source)
        await rc.emit(EventType.USER_MESSAGE, {"text": content, "source": run.source})
        provider = self.provider()
        parts: list[str] = []  # the text of the model step in progress (kept on cancel)
        trace: dict[str, Any] = {}
        try:
            rules = await self._rules(run.tenant, session.bank_id, trace)
            grounded = GroundedAnswer.of(content, split=not provider.follows_tools)
            if run.source != Source.WAKEUP and session.bank_id:
                recall = self._recall_part(rc, history, session.bank_id, grounded, trace)
                await grounded.recall(recall)
                if session.remember_messages and run.source == Source.USER:
                    # after the recall: the message is not its own memory
                    trace["remembered"] = await self._remember(rc, content, session.bank_id)
            if not provider.follows_tools and grounded.recalled:
                text = await self._answer_from_memories(rc, provider, grounded, parts, rules)
            else:
                found = grounded.memories[0] if grounded.memories else None
                question = (
                    content
                    if found is None
                    else grounded_question(memory_lines(found).splitlines(), content)
                )
                system = f"{SYSTEM_PROMPT}\n{rules}" if rules else SYSTEM_PROMPT
                conversation = [ChatMessage.system(system), *to_chat(history)]
                conversation.append(ChatMessage.user(question))
                text = await self._agent_loop(rc, provider, conversation, session.bank_id, parts)
            final = await self._store(run, "assistant", text)
            await rc.emit(EventType.MESSAGE, {"text": text, "message_id": final.id})
            return {"text": text, "message_id": final.id, "trace": trace}
        except OperationCancelled:
            status = "interrupted" if rc.token.reason == SHUTDOWN else "cancelled"
            await self._store(run, "assistant", "".join(parts), status=status)
            raise

    async def _rules(self, tenant: str, bank_id: str | None, trace: dict[str, Any]) -> str:
        """The bank's directives as the prompt says them (``""`` for none), their ids in
        ``trace["directives"]``."""
        if self.directives is None or not bank_id:
            return ""
        try:
            found = await self.directives(tenant, bank_id)
        except NotFound:
            return ""  # the session's bank was deleted: no bank, no rules
        trace["directives"] = [d.id for d in found]
        return rules_text(found)

    async def _agent_loop(
        self,
        rc: RunContext,
        provider: ChatProvider,
        conversation: list[ChatMessage],
        bank_id: str | None,
        parts: list[str],
    ) -> str:
        """Model steps with the tools until one answers without a tool call; its text (or
        a note when :attr:`max_steps` ran out)."""
        run = rc.run
        assert run.session_id is not None
        for _step in range(self.max_steps):
            parts.clear()
            calls = await self._model_step(rc, provider, conversation, TOOL_SPECS, parts)
            text = "".join(parts)
            if not calls:
                return text
            await self._store(
                run,
                "assistant",
                text,
                tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
            )
            parts.clear()
            conversation.append(ChatMessage.assistant(text, [c.to_call() for c in calls]))
            for call in calls:
                rc.token.raise_if_cancelled()
                result = await self.tools.call(
                    call.name,
                    call.arguments,
                    session_id=run.session_id,
                    tenant=run.tenant,
                    bank_id=bank_id,
                )
                await rc.emit(
                    EventType.TOOL_RESULT,
                    {"id": call.id, "name": call.name, "ok": result.ok, "content": result.content},
                )
                await self._store(run, "tool", result.content, tool_call_id=call.id, name=call.name)
                conversation.append(ChatMessage.tool(call.id, result.content, call.name))
        return f"(stopped after {self.max_steps} tool steps)"

    async def _answer_from_memories(
        self,
        rc: RunContext,
        provider: ChatProvider,
        grounded: GroundedAnswer,
        parts: list[str],
        rules: str = "",
    ) -> str:
        """A model that cannot use tools gives the grounded answer (see the module
        docstring): each part from its own memories in one generation, without the earlier
        transcript (a small model repeats its last answer when it sees it) and without
        tools. Every word streamed goes to *parts* (kept if the turn is cancelled)."""

        async def generate(messages: list[ChatMessage]) -> str:
            start = len(parts)
            await self._model_step(rc, provider, messages, None, parts)
            return "".join(parts[start:])

        async def say(text: str) -> None:
            parts.append(text)
            await rc.emit(EventType.TEXT_DELTA, {"text": text})

        return await grounded.answer(generate, say, rules=rules)

    async def _model_step(
        self,
        rc: RunContext,
        provider: ChatProvider,
        messages: list[ChatMessage],
        tools: Sequence[ToolSpec] | None,
        parts: list[str],
    ) -> list[ToolCallEvent]:
        """One streamed model call: its text deltas (appended to *parts*) and tool calls go
        to the journal as they come; returns the tool calls."""
        calls: list[ToolCallEvent] = []
        stream = traced(
            provider,
            metered_stream(provider, messages, tools=tools, max_tokens=self.max_tokens),
            max_tokens=self.max_tokens,
        )
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                rc.token.raise_if_cancelled()  # a provider that ignored the token
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                    await rc.emit(EventType.TEXT_DELTA, {"text": event.text})
                elif isinstance(event, ToolCallEvent):
                    calls.append(event)
                    await rc.emit(
                        EventType.TOOL_CALL,
                        {"id": event.id, "name": event.name, "arguments": event.arguments},
                    )
        rc.token.raise_if_cancelled()
        return calls

    def _recall_part(
        self,
        rc: RunContext,
        history: Sequence[Message],
        bank_id: str,
        grounded: GroundedAnswer,
        trace: dict[str, Any],
    ) -> RecallPart:
        """The turn's own recall of each part of *grounded* (the message itself, or each of
        its parts for a model that answers them one by one), as a tool step; its trace entry
        goes to ``trace["grounding"]``. A lone question's query carries the names the user's
        previous message mentioned (or, naming none, its text)."""
        previous = next((m.content for m in reversed(history) if m.role == "user"), "")
        alone = len(grounded.parts) == 1

        async def recall(part: str, index: int) -> list[StoredUnit] | None:
            query = f"{part}\n{_context_of(previous)}" if alone and previous else part
            entry, found = await self._ground(rc, query, bank_id, index)
            trace.setdefault("grounding", []).append(entry)
            return found

        return recall

    async def _ground(
        self, rc: RunContext, query: str, bank_id: str, index: int = 0
    ) -> tuple[dict[str, Any], list[StoredUnit] | None]:
        """One recall of the turn's own, as a tool step (see the module docstring). Returns
        its trace entry and its memories (``None`` when the recall failed)."""
        run = rc.run
        found = await self.tools.ground(query, run.tenant, bank_id)
        duration_ms = round(found.seconds * 1000, 1)
        count = len(found.memories)
        await self._tool_step(
            rc,
            f"{GROUNDING_CALL_ID}_{run.id[-12:]}_{index}",
            "recall",
            {"query": query},
            found.result,
            {"memories": count, "duration_ms": duration_ms},
        )
        entry = {"ok": found.result.ok, "memories": count, "duration_ms": duration_ms}
        return entry, found.memories if found.result.ok else None

    async def _remember(self, rc: RunContext, content: str, bank_id: str) -> dict[str, Any]:
        """Retain the user's message into the session's bank (``remember_messages``), as a
        ``retain`` tool step; a failure is the step's error, not the turn's."""
        run = rc.run
        assert run.session_id is not None
        started = time.perf_counter()
        result = await self.tools.call(
            "retain",
            {"content": content},
            session_id=run.session_id,
            tenant=run.tenant,
            bank_id=bank_id,
        )
        duration_ms = round((time.perf_counter() - started) * 1000, 1)
        arguments = {"content": content}
        await self._tool_step(
            rc, f"call_remember_{run.id[-12:]}", "retain", arguments, result, None
        )
        return {"ok": result.ok, "duration_ms": duration_ms}

    async def _tool_step(
        self,
        rc: RunContext,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        result: ToolResult,
        output: dict[str, Any] | None,
    ) -> None:
        """A tool call the turn made itself: ``tool_call`` and ``tool_result`` in the journal,
        the call and its result in the transcript, as if the model had made it."""
        call = {"id": call_id, "name": name, "arguments": arguments}
        await rc.emit(EventType.TOOL_CALL, call)
        data: dict[str, Any] = {
            "id": call_id,
            "name": name,
            "ok": result.ok,
            "content": result.content,
        }
        if output is not None:
            data["output"] = output
        await rc.emit(EventType.TOOL_RESULT, data)
        await self._store(rc.run, "assistant", "", tool_calls=[call])
        await self._store(rc.run, "tool", result.content, tool_call_id=call_id, name=name)

    async def on_interrupted(self, run: Run) -> None:
        """Store the partial output of a turn whose worker died, marked ``interrupted``."""
        if run.session_id is None:
            return
        events = await self.io.call(self.runs.events_after, run.id, 0, 1_000_000)
        if any(e.type == EventType.MESSAGE for e in events):
            return  # the final message was stored before the process died
        parts: list[str] = []
        for event in events:
            if event.type == EventType.TOOL_RESULT:
                parts = []
            elif event.type == EventType.TEXT_DELTA:
                parts.append(str(event.data.get("text", "")))
        stored = await self.io.call(self.sessions.messages, run.session_id)
        if any(m.run_id == run.id and m.status == "interrupted" for m in stored):
            return
        if not any(m.run_id == run.id for m in stored) and run.source != Source.WAKEUP:
            payload = await self.io.call(self.runs.payload, run.id)
            await self._store(run, "user", turn_text(payload), source=run.source)
        await self._store(run, "assistant", "".join(parts), status="interrupted")
