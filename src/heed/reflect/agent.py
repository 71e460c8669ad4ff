"""The reflect agent loop: recall first, then let the model use tools, then answer.

One reflect is:

0. the bank's **mental models** the question finds (through the port
   :class:`heed.reflect.ports.MentalModelSource`), unless the request excludes them, shown
   to the model as a ``search_mental_models`` tool step and cited in
   ``based_on.mental_models`` (no step when none is found);
1. **recall** with the question itself, always, before the model is asked anything
   (shown to the model as its own first tool call, so it sees what it has);
2. up to ``ITERATIONS[budget]`` model calls with the tools ``recall`` (search
   again), ``expand`` (read the chunk or document a memory came from) and
   ``done`` (the answer and the ids of the memories it used); a reply with no
   tool call is the answer too;
3. the last iteration offers no tools and asks for the answer, so a reflect
   always ends with one;
3a. **the answer of a model that cannot use the tools**: a provider that says so
   (``follows_tools``: the embedded model) skips step 2; a broken tool call (a small
   model's half-written JSON), or no answer, a refusal ("I could not find...") or a tool
   call as the final answer although memories were recalled, ends it. Then the question
   gets the grounded answer chat turns also give (:class:`heed.llm.grounding.GroundedAnswer`):
   each part of it answered in one generation over its memories, with no tools (several
   parts are recalled one by one; a lone part uses every memory seen so far); a part the
   model refuses is followed by its best memories, quoted;
4. with a ``response_schema``, one more call turns the answer into JSON, which
   is validated against the schema (a failure is reported in
   ``structured_output_error``, not raised).

Cancellation: the loop checks the token before each iteration and each tool; the
nested recall runs under the same request context, so its own checkpoints see
the same token; every model call is a provider stream, which stops within
milliseconds of a cancel (see :mod:`heed.llm`). The reflect lane slot is held
for the whole loop.

Prompts are short and structured (numbered memories, one line each, capped), so
the tiny local model stays useful; a stronger ``openai`` model does better.

**Directives**: the bank's active directives that apply to the request's tags (every
active one with ``apply_all_directives``; :mod:`heed.memory.directives.rules`) are said in the
system prompt of the loop and of the grounded answer, and listed in
``based_on.directives``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from heed.llm.base import (
    ChatMessage,
    ChatProvider,
    Completion,
    ToolCall,
    ToolSpec,
    Usage,
    complete,
)
from heed.llm.grounding import (
    MEMORY_CHARS,
    RECALL_TOOL,
    GroundedAnswer,
    clip,
    is_unanswered,
    looks_like_a_tool_call,
    memory_line,
)
from heed.llm.usage import llm_work
from heed.memory import InvalidInput, MemoryEngine, NotFound
from heed.memory.bank_config.view import BankSettings
from heed.memory.directives.rules import Directive, DirectiveScope, rules_text
from heed.memory.directives.service import applicable_directives
from heed.memory.models import DISPOSITION_DEFAULT, Bank, RecallQuery, StoredUnit, TagsMatch
from heed.reflect.ports import ConsultedModel, MentalModelSource
from heed.reflect.schema import structured_output
from heed.runs.events import EventType
from heed.runtime import Lane, raise_if_cancelled, run_in_thread

__all__ = [
    "ITERATIONS",
    "TOOLS",
    "LLMTrace",
    "ReflectAgent",
    "ReflectListener",
    "ReflectOutcome",
    "ReflectRequest",
    "ToolTrace",
]

Budget = Literal["low", "mid", "high"]

#: Model calls after the first recall, per budget (the last one must answer).
ITERATIONS: Final[dict[str, int]] = {"low": 3, "mid": 5, "high": 8}
#: Token budget of each recall the agent makes, per budget (a bank's ``recall_max_tokens``
#: replaces it: :class:`heed.memory.bank_config.view.BankSettings`).
RECALL_TOKENS: Final[dict[str, int]] = {"low": 1024, "mid": 2048, "high": 4096}
#: Memories shown to the model per recall (each clipped to ``MEMORY_CHARS``), and
#: characters of an expansion.
MEMORIES_PER_RECALL: Final = 8
EXPAND_CHARS: Final = 2000
NO_ANSWER: Final = "I could not find an answer in the memories."

TOOLS: Final = (
    RECALL_TOOL,
    ToolSpec(
        name="expand",
        description="Read the text a memory came from: its chunk, or its whole document.",
        parameters={
            "type": "object",
            "properties": {
                "memory_id": {"type": "string"},
                "depth": {"type": "string", "enum": ["chunk", "document"]},
            },
            "required": ["memory_id"],
        },
    ),
    ToolSpec(
        name="done",
        description="Finish: the answer, and the ids of the memories it is based on.",
        parameters={
            "type": "object",
            "properties": {
                "answer": {"type": "string"},
                "memory_ids": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["answer"],
        },
    ),
)


@dataclass(slots=True)
class ReflectRequest:
    """A validated reflect request (the HTTP layer builds it from the wire body)."""

    query: str
    budget: Budget = "low"
    context: str | None = None
    #: Say every active directive, whatever its tags (else they are scoped by ``tags``).
    apply_all_directives: bool = False
    max_tokens: int | None = None
    response_schema: dict[str, Any] | None = None
    tags: list[str] | None = None
    tags_match: TagsMatch = "any"
    include_tool_output: bool = True
    #: Consult no mental model (``exclude_mental_models``), or not these.
    exclude_mental_models: bool = False
    exclude_mental_model_ids: list[str] | None = None
    #: The fact types the agent's recalls return (``None``: every type).
    fact_types: list[str] | None = None


@dataclass(slots=True)
class ToolTrace:
    """One tool call of the loop (``iteration`` 0 is the first, forced recall)."""

    tool: str
    input: dict[str, Any]
    output: dict[str, Any] | None
    duration_ms: int
    iteration: int


@dataclass(slots=True)
class LLMTrace:
    """One model call: ``agent_<n>``, ``final`` or ``structured_output``."""

    scope: str
    duration_ms: int


@dataclass(slots=True)
class ReflectOutcome:
    """What a reflect produced."""

    text: str
    based_on: list[StoredUnit]
    usage: Usage
    tool_calls: list[ToolTrace] = field(default_factory=list)
    llm_calls: list[LLMTrace] = field(default_factory=list)
    structured_output: dict[str, Any] | None = None
    structured_output_error: str | None = None
    #: The directives the prompts said (``based_on.directives``).
    directives: list[Directive] = field(default_factory=list)
    #: The mental models consulted before the recall (``based_on.mental_models``).
    mental_models: list[ConsultedModel] = field(default_factory=list)


#: Streaming callback: ``(event, data)`` for ``tool_call``, ``tool_result``,
#: ``text_delta`` (model text as it arrives, with its ``iteration``) and ``message`` (the
#: answer), with the payloads of :mod:`heed.runs.events`.
ReflectListener = Callable[[EventType, dict[str, Any]], Awaitable[None]]


def _system_prompt(bank: Bank, settings: BankSettings, rules: str = "") -> str:
    """The loop's system prompt: the task, the bank's mission, background and disposition
    (when not the default; both from its *settings*), then its directives (*rules*:
    :func:`rules_text`)."""
    lines = [
        "You answer questions using the memories of a memory bank.",
        "Use the tools: recall to search, expand to read more, done to give the answer "
        "with the ids of the memories you used. Base the answer only on the memories. "
        "Be brief.",
    ]
    if settings.reflect_mission:
        lines.append(f"Bank mission: {settings.reflect_mission}")
    if bank.background:
        lines.append(f"Background: {bank.background}")
    traits = settings.disposition()
    if any(v != DISPOSITION_DEFAULT for v in traits.values()):
        lines.append("Disposition (1-5): " + ", ".join(f"{k} {v}" for k, v in traits.items()))
    if rules:
        lines.append(rules)
    return "\n".join(lines)


@dataclass(eq=False)
class ReflectAgent:
    """Runs reflects on one engine with one provider, inside the reflect lane."""

    engine: MemoryEngine
    provider: ChatProvider
    lane: Lane
    #: How the bank's mental models are consulted first (``None``: they are not).
    mental_models: MentalModelSource | None = None

    async def run(
        self,
        bank: Bank,
        request: ReflectRequest,
        listener: ReflectListener | None = None,
        *,
        background: bool = False,
    ) -> ReflectOutcome:
        """Run one reflect in a reflect lane slot; see the module docstring. *background*
        work (a mental model's refresh) takes its slot, and its recalls theirs, only when no
        user's work waits for one (:mod:`heed.runtime.slots`).

        Raises ``OperationCancelled`` (and ``LaneFull`` when the lane sheds).
        """
        async with self.lane.slot(background=background):
            return await self.run_in_held_slot(bank, request, listener, background=background)

    async def run_in_held_slot(
        self,
        bank: Bank,
        request: ReflectRequest,
        listener: ReflectListener | None = None,
        *,
        background: bool = False,
    ) -> ReflectOutcome:
        """:meth:`run` for a caller that already holds a reflect lane slot (the worker of a
        reflect run takes it, as for every run kind with a lane)."""
        with llm_work(bank.tenant, bank.bank_id, "reflect", background=background):
            return await _Loop(self, bank, request, listener, background).run()


class _Loop:
    """The state of one reflect."""

    def __init__(
        self,
        agent: ReflectAgent,
        bank: Bank,
        request: ReflectRequest,
        listener: ReflectListener | None,
        background: bool = False,
    ) -> None:
        self.engine = agent.engine
        self.provider = agent.provider
        self.lookup = agent.mental_models
        self.background = background
        self.mental_models: list[ConsultedModel] = []
        self.bank = bank
        self.settings = self.engine.settings(bank)
        self.request = request
        self.listener = listener
        self.seen: dict[str, StoredUnit] = {}
        self.recalled: list[StoredUnit] = []  # what the latest recall found, in rank order
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tool_calls: list[ToolTrace] = []
        self.llm_calls: list[LLMTrace] = []
        self.directives: list[Directive] = []  # the bank's, for this request's scope
        self.rules = ""  # the directives as the prompts say them

    async def _emit(self, event: EventType, data: dict[str, Any]) -> None:
        if self.listener is not None:
            await self.listener(event, data)

    async def run(self) -> ReflectOutcome:
        request = self.request
        question = request.query
        if request.context:
            question = f"{question}\n\nContext: {request.context}"
        rules_scope = DirectiveScope(request.tags, request.tags_match, request.apply_all_directives)
        self.directives = await applicable_directives(self.engine, self.bank, rules_scope)
        self.rules = rules_text(self.directives)
        messages = [
            ChatMessage.system(_system_prompt(self.bank, self.settings, self.rules)),
            ChatMessage.user(question),
        ]

        raise_if_cancelled()
        await self._consult_mental_models(messages)
        first = ToolCall(id="call_0_recall", name="recall", arguments={"query": request.query})
        messages.append(ChatMessage.assistant("", [first]))
        messages.append(ChatMessage.tool(first.id, await self._tool(first, 0), name="recall"))

        answer: str | None = None
        used: list[str] | None = None
        # A model that cannot use the tools skips the loop: straight to the answer below.
        iterations = ITERATIONS[request.budget] if self.provider.follows_tools else 0
        for iteration in range(1, iterations + 1):
            raise_if_cancelled()
            final = iteration == iterations
            if final:
                messages.append(
                    ChatMessage.user("Answer the question now, in plain text, from the memories.")
                )
            scope = "final" if final else f"agent_{iteration}"
            completion = await self._call(messages, None if final else TOOLS, scope, iteration)
            if not final and not completion.tool_calls and looks_like_a_tool_call(completion.text):
                # A model that cannot call the tools (a small model's broken JSON) will not
                # get better at it: answer from what was recalled, in one generation.
                break
            if final or not completion.tool_calls:
                # The last call offers no tools: whatever it says is the answer.
                answer = completion.text.strip()
                break
            messages.append(completion.as_message())
            done = next((c for c in completion.tool_calls if c.name == "done"), None)
            if done is not None:
                answer = str(done.arguments.get("answer") or completion.text).strip()
                ids = done.arguments.get("memory_ids")
                used = [str(i) for i in ids] if isinstance(ids, list) else None
                self._trace_tool(done, iteration, 0.0, None)
                break
            for call in completion.tool_calls:
                raise_if_cancelled()
                messages.append(
                    ChatMessage.tool(call.id, await self._tool(call, iteration), name=call.name)
                )

        if self.seen and (answer is None or is_unanswered(answer)):
            answer = await self._answer_from_memories(iterations + 1)
        text = answer or NO_ANSWER
        await self._emit(EventType.MESSAGE, {"text": text})
        if used is not None and any(i in self.seen for i in used):
            based_on = [self.seen[i] for i in dict.fromkeys(used) if i in self.seen]
        else:
            based_on = list(self.seen.values())
        outcome = ReflectOutcome(
            text=text,
            based_on=based_on,
            usage=Usage(self.prompt_tokens, self.completion_tokens),
            tool_calls=self.tool_calls,
            llm_calls=self.llm_calls,
            directives=self.directives,
            mental_models=self.mental_models,
        )
        if request.response_schema is not None:
            raise_if_cancelled()
            outcome.structured_output, outcome.structured_output_error = await structured_output(
                self._call, text, request.response_schema
            )
            outcome.usage = Usage(self.prompt_tokens, self.completion_tokens)
        return outcome

    async def _consult_mental_models(self, messages: list[ChatMessage]) -> None:
        """Before the first recall: the bank's mental models the question finds (unless the
        request excludes them), shown to the model as a ``search_mental_models`` tool step
        and cited in ``based_on.mental_models``. No step when none is found."""
        request = self.request
        if self.lookup is None or request.exclude_mental_models:
            return
        found = await self.lookup.relevant(
            self.bank, request.query, request.exclude_mental_model_ids or ()
        )
        if not found:
            return
        self.mental_models = list(found)
        call = ToolCall(
            id="call_0_mental_models",
            name="search_mental_models",
            arguments={"query": request.query},
        )
        await self._emit(
            EventType.TOOL_CALL,
            {"id": call.id, "name": call.name, "arguments": call.arguments, "iteration": 0},
        )
        output = {"mental_models": [{"id": m.id, "name": m.name} for m in found]}
        self._trace_tool(call, 0, 0.0, output)
        await self._emit(
            EventType.TOOL_RESULT,
            {"id": call.id, "name": call.name, "ok": True, "output": output, "iteration": 0},
        )
        text = "\n\n".join(
            f"[mental model {m.id}] {m.name} ({m.source_query}):\n{clip(m.content, EXPAND_CHARS)}"
            for m in found
        )
        messages.append(ChatMessage.assistant("", [call]))
        messages.append(ChatMessage.tool(call.id, text, name=call.name))

    async def _answer_from_memories(self, iteration: int) -> str:
        """The answer of a model that could not use the tools (see the module docstring):
        the grounded answer of :mod:`heed.llm.grounding` over the question; its parts, when
        there are several, each recalled by a ``recall`` tool step of *iteration*; a lone
        part answered from every memory seen so far."""
        grounded = GroundedAnswer.of(self.request.query)
        several = len(grounded.parts) > 1

        async def recall(part: str, index: int) -> list[StoredUnit]:
            if not several:
                return list(self.seen.values())
            call_id = f"call_{iteration}_{index}_recall"
            self.recalled = []  # a recall that fails leaves none, not the last part's
            await self._tool(
                ToolCall(id=call_id, name="recall", arguments={"query": part}), iteration
            )
            return self.recalled

        async def generate(messages: list[ChatMessage]) -> str:
            return (await self._call(messages, None, "answer_from_memories", iteration)).text

        async def say(text: str) -> None:
            await self._emit(EventType.TEXT_DELTA, {"text": text, "iteration": iteration})

        await grounded.recall(recall)
        return await grounded.answer(
            generate, say, context=self.request.context, nothing_found=NO_ANSWER, rules=self.rules
        )

    # -- model calls -------------------------------------------------------------------

    async def _call(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None,
        scope: str,
        iteration: int,
    ) -> Completion:
        """One streamed model call, forwarding text deltas to the listener."""
        started = time.perf_counter()

        async def on_text(text: str) -> None:
            await self._emit(EventType.TEXT_DELTA, {"text": text, "iteration": iteration})

        max_tokens = self.request.max_tokens if tools is None else None
        result = await complete(
            self.provider, messages, tools=tools, max_tokens=max_tokens, on_text=on_text
        )
        self.prompt_tokens += result.usage.prompt_tokens
        self.completion_tokens += result.usage.completion_tokens
        self.llm_calls.append(LLMTrace(scope, int((time.perf_counter() - started) * 1000)))
        return result

    # -- tools -------------------------------------------------------------------------

    def _trace_tool(
        self, call: ToolCall, iteration: int, seconds: float, output: dict[str, Any] | None
    ) -> None:
        self.tool_calls.append(
            ToolTrace(
                tool=call.name,
                input=dict(call.arguments),
                output=output if self.request.include_tool_output else None,
                duration_ms=int(seconds * 1000),
                iteration=iteration,
            )
        )

    async def _tool(self, call: ToolCall, iteration: int) -> str:
        """Run one tool call; returns the text the model sees (errors included)."""
        await self._emit(
            EventType.TOOL_CALL,
            {"id": call.id, "name": call.name, "arguments": call.arguments, "iteration": iteration},
        )
        started = time.perf_counter()
        try:
            if call.name == "recall":
                text, output = await self._recall(call.arguments)
            elif call.name == "expand":
                text, output = await self._expand(call.arguments)
            else:
                text = f"error: unknown tool {call.name!r}; use recall, expand or done"
                output = {"error": text}
        except (InvalidInput, NotFound) as exc:
            text = f"error: {exc}"
            output = {"error": str(exc)}
        self._trace_tool(call, iteration, time.perf_counter() - started, output)
        await self._emit(
            EventType.TOOL_RESULT,
            {
                "id": call.id,
                "name": call.name,
                "ok": "error" not in output,
                "output": output,
                "iteration": iteration,
            },
        )
        return text

    async def _recall(self, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        query = str(arguments.get("query") or "").strip() or self.request.query
        budget = self.request.budget
        outcome = await self.engine.recall(
            self.bank,
            RecallQuery(
                query=query,
                budget=budget,
                max_tokens=self.settings.recall_max_tokens or RECALL_TOKENS[budget],
                tags=self.request.tags,
                tags_match=self.request.tags_match,
                types=self.request.fact_types,
            ),
            background=self.background,
        )
        units = [hit.unit for hit in outcome.hits[:MEMORIES_PER_RECALL]]
        self.recalled = units
        for unit in units:
            self.seen.setdefault(unit.id, unit)
        if not units:
            return "No memories found.", {"memories": []}
        text = "\n".join(memory_line(u, ref=u.id, limit=MEMORY_CHARS) for u in units)
        return text, {"memories": [{"id": u.id, "text": u.text} for u in units]}

    async def _expand(self, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        memory_id = str(arguments.get("memory_id") or "").strip()
        if not memory_id:
            raise InvalidInput("expand needs a memory_id")
        depth = "document" if arguments.get("depth") == "document" else "chunk"
        unit = self.seen.get(memory_id) or await self.engine.get_unit(self.bank, memory_id)
        self.seen.setdefault(unit.id, unit)
        body: str | None = None
        if depth == "chunk" and unit.chunk_id:
            chunks = await run_in_thread(
                self.engine.store.fetch_chunks, self.bank.ref, [unit.chunk_id]
            )
            chunk = chunks.get(unit.chunk_id)
            body = str(chunk["text"]) if chunk else None
        if body is None and unit.document_id:
            depth = "document"
            document = await self.engine.get_document(self.bank, unit.document_id)
            body = document.original_text
        body = body or unit.text
        text = f"[{unit.id}] {depth}:\n{clip(body, EXPAND_CHARS)}"
        return text, {"memory_id": unit.id, "depth": depth, "text": body}
