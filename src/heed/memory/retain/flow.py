"""A retain's flow: split, then read the facts and embed side by side, then write each
document as soon as it is ready.

The stages of :meth:`heed.memory.engine.MemoryEngine.retain`, by what waits on what:

1. **Split** (in a retain slot): the items become documents of units, not yet embedded
   (:func:`~heed.memory.retain.prepare.split_documents`); under an idempotency key the
   documents an earlier attempt wrote are skipped (:mod:`heed.memory.retain.idempotency`).
2. **Learn and embed, side by side.** When the bank extracts, the model reads every chunk of
   every document at once, as many as its provider lets (:func:`heed.llm.gate.call_concurrency`;
   a remote model's calls hold no retain slot, the embedded model's hold one), and a
   document's facts join it when its last chunk is read. Meanwhile an
   :class:`~heed.memory.retain.prepare.EmbedFeed` embeds each document's turns, then its
   facts as they come, document by document in order.
3. **Write** each document (one transaction, in a retain slot) once its facts are read and
   all its units embedded, in the order of the request, and tell the engine's
   ``after_retain`` hooks (consolidation's scheduler, mental models' triggers).

An asynchronous retain (*background*) writes each document as soon as it is ready: during a
long import, what was written can be recalled and consolidated while the model still reads
the rest, and consolidation takes only whole rounds while the bank has such a retain in
flight (:class:`RetainsInFlight`), so it makes no more model calls than it would after the
import. A retain whose caller waits for the answer writes once every document is ready: a
failure of the model leaves nothing written.

Background embedding takes a retain slot with ``background=True``, or the slot kept for
users while no user has wanted one for a second (:meth:`MemoryEngine.embed
<heed.memory.engine.MemoryEngine.embed>`): on an idle machine a bulk retain uses every core,
and a user arriving meanwhile waits at most one piece of
:data:`~heed.memory.retain.prepare.FEED_PIECE` units.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heed.llm.gate import call_concurrency, model_slot
from heed.llm.usage import llm_work
from heed.memory.learning.extraction import Extraction, extract_documents_facts
from heed.memory.models import Bank, PreparedDocument, PreparedUnit, RetainItem
from heed.memory.retain.idempotency import LedgerEntry, RetainKey, check_ledger, retain_key
from heed.memory.retain.prepare import (
    EmbedFeed,
    plan_documents,
    split_documents,
)
from heed.runtime import raise_if_cancelled, run_all, run_in_thread, wait_for_event

if TYPE_CHECKING:
    from heed.memory.engine import MemoryEngine

__all__ = ["ProgressCallback", "RetainSummary", "RetainsInFlight", "retain"]

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RetainSummary:
    """What a retain wrote: items, documents and units (extracted facts included), and what
    extraction did (``None`` when it did not run)."""

    items: int
    documents: int
    units: int
    document_ids: list[str]
    extraction: Extraction | None = None


class RetainsInFlight:
    """The asynchronous retains writing into each bank in this process, and a signal each
    time one of them wrote a document or ended (consolidation waits on it to take whole
    rounds). Used from one event loop."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._writes: dict[str, int] = {}
        self._changed: dict[str, asyncio.Event] = {}

    def writing(self, bank_ref: str) -> bool:
        """Whether an asynchronous retain is writing into the bank *bank_ref*."""
        return bank_ref in self._count

    def writes(self, bank_ref: str) -> int:
        """How many times the bank's retains wrote or ended so far (for :meth:`wait`)."""
        return self._writes.get(bank_ref, 0)

    @contextmanager
    def streaming(self, bank_ref: str) -> Iterator[None]:
        """Count an asynchronous retain into *bank_ref* for the block."""
        self._count[bank_ref] = self._count.get(bank_ref, 0) + 1
        try:
            yield
        finally:
            self._count[bank_ref] -= 1
            if not self._count[bank_ref]:
                del self._count[bank_ref]
            self.wrote(bank_ref)

    def wrote(self, bank_ref: str) -> None:
        """A retain wrote a document into *bank_ref* (or ended): wake its waiters."""
        self._writes[bank_ref] = self._writes.get(bank_ref, 0) + 1
        event = self._changed.pop(bank_ref, None)
        if event is not None:
            event.set()
        if bank_ref not in self._count:
            self._writes.pop(bank_ref, None)

    async def wait(self, bank_ref: str, since: int, seconds: float) -> None:
        """Return once the bank's retains wrote or ended after :meth:`writes` was *since*,
        or after *seconds*; raises ``OperationCancelled`` with the token."""
        if self.writes(bank_ref) != since or not self.writing(bank_ref):
            return
        event = self._changed.setdefault(bank_ref, asyncio.Event())
        await wait_for_event(event, seconds)


async def retain(
    engine: MemoryEngine,
    bank: Bank,
    items: list[RetainItem],
    document_tags: list[str],
    progress: ProgressCallback | None,
    idempotency_key: str | None,
    background: bool,
) -> RetainSummary:
    """Retain *items* into *bank* (see the module docstring and
    :meth:`heed.memory.engine.MemoryEngine.retain`, which validated them)."""
    plans = plan_documents(items, document_tags, idempotency_key)
    async with engine.track(bank), engine.bank_gone_is_not_found(bank):
        key: RetainKey | None = None
        recorded: dict[int, LedgerEntry] = {}
        async with engine.retain_lane.slot(background=background):
            if idempotency_key:
                # Hashing a large body is CPU work: it belongs in the offload, like the
                # ledger read.
                key = await run_in_thread(retain_key, idempotency_key, items, document_tags)
                entries = await run_in_thread(engine.store.retain_ledger, bank.ref, key.key)
                recorded = check_ledger(key, entries)
            todo = [i for i in range(len(plans)) if i not in recorded]
            documents = await run_in_thread(split_documents, [plans[i] for i in todo])
        flow = _Flow(engine, bank, documents, background)
        units = sum(entry.units for entry in recorded.values())
        written = 0

        async def write(position: int, document: PreparedDocument) -> None:
            nonlocal units, written
            ledger = (key, todo[position]) if key is not None else None
            async with engine.retain_lane.slot(background=background):
                raise_if_cancelled()
                await run_in_thread(engine.write_prepared, bank.ref, document, ledger)
            units += len(document.units)
            written += 1
            if progress is not None:
                progress(len(recorded) + written, len(plans))
            for hook in engine.after_retain:
                hook(bank)
            engine.retains.wrote(bank.ref)

        streaming = engine.retains.streaming(bank.ref) if background else nullcontext()
        with streaming:
            extraction = await flow.run(write)
    return RetainSummary(
        items=len(items),
        documents=len(plans),
        units=units,
        document_ids=[p.document_id for p in plans],
        extraction=extraction,
    )


class _Flow:
    """Stage 2 and 3 of one retain's documents (see the module docstring)."""

    def __init__(
        self, engine: MemoryEngine, bank: Bank, documents: list[PreparedDocument], background: bool
    ) -> None:
        self.engine = engine
        self.bank = bank
        self.documents = documents
        self.background = background
        self.settings = engine.settings(bank)
        self.extraction: Extraction | None = None
        #: Per document: whether its facts were read, and its units not embedded yet.
        self.learned = [False] * len(documents)
        self.unembedded = [len(document.units) for document in documents]
        self.changed = asyncio.Event()
        self.feed = EmbedFeed(
            self._embed, parallel=engine.retain_lane.capacity, on_embedded=self._embedded
        )
        for index, document in enumerate(documents):
            self.feed.put(document.units, index)

    async def run(
        self, write: Callable[[int, PreparedDocument], Awaitable[None]]
    ) -> Extraction | None:
        """Learn, embed and *write* (a coroutine function) every document; what extraction
        did. Raises what a stage raises, once every stage stopped."""

        async def write_all() -> None:
            for position, document in enumerate(self.documents):
                while not self._ready(position):
                    self.changed.clear()
                    await wait_for_event(self.changed, None)
                await write(position, document)

        await run_all([self._learn, self.feed.run, write_all], 3)
        return self.extraction

    def _ready(self, position: int) -> bool:
        """Whether the document at *position* may be written: its facts read and its units
        embedded, and, unless the retain is asynchronous, every other document's too."""
        if not self.background:
            return all(self.learned) and not any(self.unembedded)
        return self.learned[position] and not self.unembedded[position]

    async def _learn(self) -> None:
        """Read the documents' facts when the bank extracts (their calls are background
        work when the retain is), and mark what consolidation should take."""
        try:
            mode = self.settings.retain_extraction_mode
            extractor = self.engine.learning.extractor
            if mode == "off" or extractor is None:
                self.engine.mark_for_consolidation(self.bank, self.documents, self.settings)
                self.learned = [True] * len(self.documents)
                self.changed.set()
                return
            provider = extractor()
            self.extraction = Extraction()
            background = self.background
            concurrency = call_concurrency(provider, background=background)
            with llm_work(self.bank.tenant, self.bank.bank_id, "extraction", background=background):
                async with model_slot(provider, self.engine.retain_lane, background=background):
                    await extract_documents_facts(
                        self.documents,
                        provider,
                        mode,
                        self.settings.retain_mission or None,
                        self.extraction,
                        concurrency=concurrency,
                        on_facts=self._facts,
                        on_document=self._learned,
                    )
        finally:
            self.feed.close()

    def _facts(self, index: int, facts: list[PreparedUnit]) -> None:
        """A chunk of document *index* stated *facts*: embed them."""
        self.unembedded[index] += len(facts)
        self.feed.put(facts, index)

    def _learned(self, index: int, facts: list[PreparedUnit]) -> None:
        """Every chunk of document *index* was read: its *facts* join it."""
        document = self.documents[index]
        document.units.extend(facts)
        self.engine.mark_for_consolidation(self.bank, [document], self.settings, self.extraction)
        self.learned[index] = True
        self.changed.set()

    def _embedded(self, index: int, count: int) -> None:
        self.unembedded[index] -= count
        self.changed.set()

    async def _embed(self, units: list[PreparedUnit]) -> None:
        await self.engine.embed(units, background=self.background)
