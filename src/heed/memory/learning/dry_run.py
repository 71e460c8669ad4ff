"""Dry-run extraction: what retain's fact extraction would state for some content, writing
nothing.

``POST .../memories/dry-run-extract`` previews an extraction (a candidate
``retain_mission``, another ``retain_extraction_mode``) without changing the bank. The
content is prepared exactly as a retain prepares one item (split into units with their
dates and entities: :func:`heed.memory.retain.prepare.split_documents`), cut into the same
chunks, and each chunk is read by the same extraction call
(:func:`heed.memory.learning.extraction.extract_chunk`), with the bank's settings unless
the request overrides them. Nothing is embedded, resolved, linked or stored.

The answer: the candidate facts (their text, type, dates, the entity names they carry, the
chunk they came from), each chunk as the extractor saw it with how many facts it gave (a
chunk whose reply stayed malformed gives none and is counted in ``failed_chunks``), and the
tokens every call took (the provider's reported usage, re-asks and malformed replies
included).

Refused with a 400 naming why, before any LLM call: a bank that does not extract
(``retain_extraction_mode`` off) when the request names no mode, and a server with no
provider for extraction. A request whose mode is ``off`` calls no LLM: the chunks, no fact.
Like a sync retain, the work holds a retain slot, is the bank's work (a bank delete stops
it) and runs under the request's token: a client that leaves stops the LLM call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from heed.llm.base import BadModelOutput, Usage
from heed.memory.learning.extraction import (
    EXTRACTION_MODES,
    chunk_units,
    extract_chunk,
    facts_prompt,
)
from heed.memory.models import Bank, InvalidInput, PreparedUnit, RetainItem, refuse_nul
from heed.memory.retain.prepare import plan_documents, split_documents
from heed.runtime import run_in_thread

if TYPE_CHECKING:
    from heed.memory.engine import MemoryEngine

__all__ = ["DryRun", "DryRunChunk", "DryRunFact", "dry_run_extract"]


@dataclass(frozen=True, slots=True)
class DryRunFact:
    """One candidate fact; ``chunk_index`` is its chunk's position in :attr:`DryRun.chunks`."""

    text: str
    fact_type: str
    occurred_start: str | None
    occurred_end: str | None
    entities: list[str]
    chunk_index: int


@dataclass(frozen=True, slots=True)
class DryRunChunk:
    """One chunk as the extractor saw it (its numbered units) and the facts it gave."""

    text: str
    fact_count: int


@dataclass(slots=True)
class DryRun:
    """What a dry-run extraction found (see the module docstring)."""

    facts: list[DryRunFact] = field(default_factory=list)
    chunks: list[DryRunChunk] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    failed_chunks: int = 0

    def add_usage(self, usage: Usage | None) -> None:
        if usage is not None:
            self.usage = Usage(
                self.usage.prompt_tokens + usage.prompt_tokens,
                self.usage.completion_tokens + usage.completion_tokens,
            )


def _fact(unit: PreparedUnit, chunk_index: int) -> DryRunFact:
    return DryRunFact(
        text=unit.text,
        fact_type=unit.fact_type,
        occurred_start=unit.occurred_start.isoformat() if unit.occurred_start else None,
        occurred_end=unit.occurred_end.isoformat() if unit.occurred_end else None,
        entities=list(dict.fromkeys(e.name for e in unit.entities)),
        chunk_index=chunk_index,
    )


async def dry_run_extract(
    engine: MemoryEngine,
    bank_id: str,
    item: RetainItem,
    *,
    mode: str | None = None,
    mission: str | None = None,
) -> DryRun:
    """Extract *item*'s facts as a retain into the bank *bank_id* would, writing nothing;
    *mode* and *mission* override the bank's ``retain_extraction_mode`` and
    ``retain_mission`` (``None``: the bank's; a mission ``""``: none). Raises
    :class:`InvalidInput` (400) naming a bad input or why nothing can be extracted,
    :class:`heed.memory.models.NotFound`, ``OperationCancelled`` and the provider's
    errors (an upstream failure: nothing to preview)."""
    if mode is not None and mode not in EXTRACTION_MODES:
        raise InvalidInput(
            f"retain_extraction_mode {mode!r} is unknown: use one of {', '.join(EXTRACTION_MODES)}"
        )
    refuse_nul(mission, "retain_mission")
    engine.validate_items([item])

    async def run(bank: Bank) -> DryRun:
        settings = engine.settings(bank)
        chosen = mode or settings.retain_extraction_mode
        if mode is None and chosen == "off":
            raise InvalidInput(
                f"bank {bank.bank_id!r} does not extract facts at retain (its "
                "retain_extraction_mode is off): give retain_extraction_mode (concise or "
                "verbose) to preview an extraction"
            )
        if chosen != "off" and engine.learning.extractor is None:
            raise InvalidInput(
                "this server has no LLM provider for fact extraction, so nothing can be "
                "extracted (HEED_RETAIN_LLM_*, else HEED_LLM_*)"
            )
        given = mission if mission is not None else (settings.retain_mission or None)
        async with engine.track(bank), engine.retain_lane.slot():
            plans = plan_documents([item], [])
            [document] = await run_in_thread(split_documents, plans)
            extractor = engine.learning.extractor
            provider = extractor() if chosen != "off" and extractor is not None else None
            found = DryRun()
            for index, positions in enumerate(chunk_units(document.units)):
                text = facts_prompt(document.units, positions, chosen, given)[-1].content
                if provider is None:
                    found.chunks.append(DryRunChunk(text, 0))
                    continue
                try:
                    chunk = await extract_chunk(document.units, positions, provider, chosen, given)
                except BadModelOutput as exc:
                    found.failed_chunks += 1
                    found.add_usage(exc.usage)
                    found.chunks.append(DryRunChunk(text, 0))
                    continue
                found.add_usage(chunk.usage)
                found.chunks.append(DryRunChunk(text, len(chunk.facts)))
                found.facts.extend(_fact(unit, index) for unit in chunk.facts)
            return found

    return await engine.on_bank(bank_id, run)
