"""Fact extraction at retain: an LLM reads a document's units and states the facts in them.

A document's units (one per dialogue turn, or per group of sentences) are cut into
**chunks** of about :data:`CHUNK_CHARS` characters, whole units each. For every chunk one
LLM call with structured output (:data:`FACTS_SCHEMA`, validated; a malformed reply is
asked again once: :func:`heed.llm.structured.complete_json`) answers with facts: the
statement, ``world`` or ``experience``, who / what / when / where / why, when it happened,
the entities it names, the units it came from (by their number in the prompt) and which
earlier facts of the reply caused it. Each fact becomes a unit of its own beside the
verbatim ones, which stay retrievable:

- its **provenance** (``source_ids``) is the ids of the units it cites, so a recalled fact
  is always traced back to what was said; a fact citing no valid unit cites the whole chunk;
- its **entities** are the ones it names plus those found in its text, resolved against the
  bank's by canonical name when written (:mod:`heed.memory.retain.links`);
- a cause becomes a ``causal`` link between the two facts.

A retain's chunks (of all its documents) are extracted concurrently, as many at once as the
provider lets such work have in flight (:func:`heed.llm.gate.call_concurrency`: a remote
upstream's ``HEED_LLM_CONCURRENCY``; one at a time on the embedded model, which is CPU
work); the facts
keep the chunks' order. A chunk whose reply stays malformed keeps only its verbatim units,
and is counted (:attr:`Extraction.failed_chunks`). Upstream failures (unreachable, 429 after the
provider's retries) propagate: the retain fails, nothing of the document is written, and the
caller retries the whole retain. The calls run under the active context's token (a sync
retain's request, an async retain's run), so a client that leaves stops them mid-call.

Which banks extract (:func:`extraction_mode`): the bank's ``retain_extraction_mode``
(``off``, ``concise`` or ``verbose``), else the server's ``HEED_RETAIN_EXTRACTION`` (``auto``:
on when an ``openai`` provider serves retain; the embedded model is too small to extract
facts that help recall: see the README and ``benchmarks/extraction_quality.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from heed.llm.base import BadModelOutput, ChatMessage, ChatProvider, JsonSchemaFormat, Usage
from heed.llm.structured import complete_json, index_list
from heed.memory.bank_config.settings import ServerDefaults
from heed.memory.entities import extract_entities
from heed.memory.models import EntityRef, PreparedDocument, PreparedUnit
from heed.memory.retain.units import index_text
from heed.runtime import raise_if_cancelled, run_all

__all__ = [
    "CHUNK_CHARS",
    "EXTRACTION_MODES",
    "FACTS_SCHEMA",
    "ChunkFacts",
    "Extraction",
    "Learning",
    "chunk_units",
    "extract_chunk",
    "extract_documents_facts",
    "facts_prompt",
]

#: About how many characters of units one extraction call reads.
CHUNK_CHARS: Final = 3000
#: The most facts one chunk may give (a bound on what one reply can write).
MAX_FACTS_PER_CHUNK: Final = 64
EXTRACTION_MODES: Final = ("off", "concise", "verbose")
_FACT_TYPES: Final = ("world", "experience")

_NULLABLE_TEXT: Final = {"type": ["string", "null"], "maxLength": 1000}
FACTS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["facts"],
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": MAX_FACTS_PER_CHUNK,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["text", "fact_type", "sources"],
                "properties": {
                    "text": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "fact_type": {"enum": list(_FACT_TYPES)},
                    "who": _NULLABLE_TEXT,
                    "what": _NULLABLE_TEXT,
                    "when": _NULLABLE_TEXT,
                    "where": _NULLABLE_TEXT,
                    "why": _NULLABLE_TEXT,
                    "occurred_start": {"type": ["string", "null"], "maxLength": 64},
                    "occurred_end": {"type": ["string", "null"], "maxLength": 64},
                    "entities": {
                        "type": "array",
                        "maxItems": 32,
                        "items": {"type": "string", "minLength": 1, "maxLength": 200},
                    },
                    "sources": index_list(64),
                    "causes": index_list(16),
                },
            },
        }
    },
}
_FORMAT: Final = JsonSchemaFormat(name="facts", schema=FACTS_SCHEMA, strict=False)

_INSTRUCTIONS: Final = (
    "You extract facts from a conversation or document for a long-term memory. "
    'The text is given as numbered units. Answer with JSON: {"facts": [...]}. '
    "Each fact is one self-contained statement (names, not pronouns; absolute dates when "
    'the text gives them) with: text; fact_type ("experience" for what the speakers did, '
    'felt or plan; "world" for facts about the world); who, what, when, where, why '
    "(null when unknown); occurred_start and occurred_end (ISO dates, or null); entities "
    "(the people, places, things named); sources (the numbers of the units it comes "
    "from); causes (the indexes, in your list, of earlier facts that caused this one)."
)
_VERBOSE: Final = " State every fact, including small details and feelings."
_CONCISE: Final = " State only facts worth remembering; skip greetings and small talk."


@dataclass(frozen=True, slots=True)
class Learning:
    """How the engine learns (:mod:`heed.memory.learning.extraction`,
    :mod:`heed.memory.learning.consolidation`): the server's defaults, which a bank's
    settings override (:meth:`heed.memory.engine.MemoryEngine.settings`), and the provider
    extraction uses (built on first use; its error is the retain's)."""

    extraction_default: str = "off"
    observations_default: bool = False
    extractor: Callable[[], ChatProvider] | None = None
    #: ``HEED_LLM_BUDGET_TOKENS_PER_HOUR`` / ``_PER_DAY`` (:mod:`heed.llm.budget`).
    budget_per_hour: int | None = None
    budget_per_day: int | None = None

    def defaults(self, min_refresh_interval: float) -> ServerDefaults:
        """The server's defaults of the bank settings that have one (extraction is ``off``
        without a provider), with *min_refresh_interval*
        (``HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS``)."""
        return ServerDefaults(
            retain_extraction_mode=self.extraction_default if self.extractor else "off",
            enable_observations=self.observations_default,
            mental_model_min_refresh_interval_seconds=min_refresh_interval,
            llm_budget_tokens_per_hour=self.budget_per_hour,
            llm_budget_tokens_per_day=self.budget_per_day,
        )


@dataclass(slots=True)
class Extraction:
    """What extraction did for one retain."""

    facts: int = 0
    chunks: int = 0
    failed_chunks: int = 0
    failures: list[str] = field(default_factory=list)
    #: The ids of the units no fact was extracted from because their chunk's reply stayed
    #: malformed (consolidation takes them verbatim).
    unread: set[str] = field(default_factory=set)

    def report(self) -> dict[str, int]:
        """The counts a retain reports (its response, its run's result)."""
        return {"facts": self.facts, "chunks": self.chunks, "failed_chunks": self.failed_chunks}


def chunk_units(units: Sequence[PreparedUnit], limit: int = CHUNK_CHARS) -> list[list[int]]:
    """Positions of *units* in chunks of whole units of about *limit* characters (a unit
    longer than that is a chunk of its own)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    size = 0
    for position, unit in enumerate(units):
        if current and size + len(unit.text) > limit:
            chunks.append(current)
            current, size = [], 0
        current.append(position)
        size += len(unit.text) + 1
    if current:
        chunks.append(current)
    return chunks


def facts_prompt(
    units: Sequence[PreparedUnit], positions: Sequence[int], mode: str, mission: str | None
) -> list[ChatMessage]:
    """The messages of one chunk's extraction call (units numbered from 0)."""
    system = _INSTRUCTIONS + (_VERBOSE if mode == "verbose" else _CONCISE)
    if mission:
        system += f" What this memory is for: {mission}"
    lines = []
    for number, position in enumerate(positions):
        unit = units[position]
        when = unit.mentioned_at.date().isoformat() if unit.mentioned_at else "unknown date"
        lines.append(f"[{number}] ({when}) {unit.text}")
    return [ChatMessage.system(system), ChatMessage.user("\n".join(lines))]


def _date(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _fact_units(
    reply: dict[str, Any], units: Sequence[PreparedUnit], positions: Sequence[int]
) -> list[tuple[PreparedUnit, list[int]]]:
    """The facts of one reply as units, each with the positions (within the reply) of the
    facts that caused it."""
    out: list[tuple[PreparedUnit, list[int]]] = []
    for fact in reply.get("facts", []):
        cited = [positions[n] for n in fact.get("sources", []) if 0 <= n < len(positions)]
        sources = list(dict.fromkeys(cited)) or list(positions)
        first = units[sources[0]]
        start = _date(fact.get("occurred_start")) or first.occurred_start
        end = _date(fact.get("occurred_end")) or (start if fact.get("occurred_start") else None)
        text = str(fact["text"]).strip()
        metadata = {k: str(fact[k]) for k in ("who", "what", "when", "where", "why") if fact.get(k)}
        given = [EntityRef(name) for name in fact.get("entities", [])]
        unit = PreparedUnit(
            id=str(uuid.uuid4()),
            text=text,
            index_text=index_text(text, first.context, first.mentioned_at),
            fact_type=str(fact["fact_type"]),
            context=first.context,
            chunk_index=first.chunk_index,
            occurred_start=start,
            occurred_end=end or first.occurred_end,
            mentioned_at=first.mentioned_at,
            metadata=metadata,
            tags=list(first.tags),
            entities=extract_entities(text, given, None),
            source_ids=[units[p].id for p in sources],
        )
        causes = [int(c) for c in fact.get("causes", []) if 0 <= int(c) < len(out)]
        out.append((unit, causes))
    return out


@dataclass(frozen=True, slots=True)
class ChunkFacts:
    """One chunk's extraction: its facts (``caused_by`` set) and the tokens its calls took."""

    facts: list[PreparedUnit]
    usage: Usage


async def extract_chunk(
    units: Sequence[PreparedUnit],
    positions: Sequence[int],
    provider: ChatProvider,
    mode: str,
    mission: str | None,
) -> ChunkFacts:
    """One extraction call (and its re-ask) for the chunk of *units* at *positions*.
    Raises ``OperationCancelled``, upstream ``ProviderError``s, and
    :class:`~heed.llm.base.BadModelOutput` when the reply stays malformed."""
    raise_if_cancelled()
    messages = facts_prompt(units, positions, mode, mission)
    reply = await complete_json(provider, messages, _FORMAT, temperature=0.0)
    chunk_facts = _fact_units(reply.value, units, positions)
    for unit, causes in chunk_facts:
        unit.caused_by = [chunk_facts[c][0].id for c in causes]
    return ChunkFacts([unit for unit, _ in chunk_facts], reply.usage)


async def extract_documents_facts(
    documents: Sequence[PreparedDocument],
    provider: ChatProvider,
    mode: str,
    mission: str | None,
    outcome: Extraction,
    *,
    concurrency: int = 1,
    on_facts: Callable[[int, list[PreparedUnit]], object] | None = None,
    on_document: Callable[[int, list[PreparedUnit]], object] | None = None,
) -> list[list[PreparedUnit]]:
    """Extract the facts of *documents* (see the module docstring), at most *concurrency*
    chunks at once across them: per document, its fact units in chunk order (``caused_by``
    naming the facts of their chunk that caused them). Records counts in *outcome*, and the
    ids of the units of chunks whose reply stayed malformed in ``outcome.unread``.
    *on_facts*, when given, is called with a document's index and each of its chunks' facts
    as soon as they are read (the engine has them embedded while other chunks' calls wait),
    and *on_document* with a document's index and all its facts, in chunk order, once its
    last chunk is read (the engine writes it when it is embedded too); both must return at
    once. Raises
    ``OperationCancelled`` (the token) and upstream ``ProviderError``s (the first one; the
    other chunks' calls are stopped); a malformed reply only costs its chunk's facts."""
    chunks = [
        (index, positions)
        for index, document in enumerate(documents)
        for positions in chunk_units(document.units)
    ]

    found: list[ChunkFacts | None] = [None] * len(chunks)
    numbers: list[list[int]] = [[] for _ in documents]  # each document's chunks
    for number, (index, _) in enumerate(chunks):
        numbers[index].append(number)
    left = [len(of) for of in numbers]  # each document's chunks not read yet

    def facts_of(index: int) -> list[PreparedUnit]:
        return [u for n in numbers[index] if (chunk := found[n]) is not None for u in chunk.facts]

    def extract(number: int) -> Callable[[], Awaitable[None]]:
        index, positions = chunks[number]
        units = documents[index].units

        async def one() -> None:
            try:
                found[number] = await extract_chunk(units, positions, provider, mode, mission)
            except BadModelOutput as exc:
                outcome.failures.append(str(exc)[:300])
                outcome.unread.update(units[p].id for p in positions)
            chunk = found[number]
            if on_facts is not None and chunk is not None:
                on_facts(index, chunk.facts)
            left[index] -= 1
            if on_document is not None and not left[index]:
                on_document(index, facts_of(index))

        return one

    await run_all([extract(number) for number in range(len(chunks))], concurrency)
    outcome.chunks += len(chunks)
    outcome.failed_chunks += sum(1 for chunk in found if chunk is None)
    facts = [facts_of(index) for index in range(len(documents))]
    outcome.facts += sum(len(of) for of in facts)
    return facts
