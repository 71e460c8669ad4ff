"""The memory engine facade: banks, retain, recall, memories and documents.

Every public coroutine is tenant-scoped (the bank is looked up by
``(tenant, bank_id)``; another tenant's bank does not exist) and runs its
blocking work through the offload.

Bank deletion and in-flight work: each piece of work on a bank (a recall, a
sync retain, an async retain operation) registers a child token of its
context's token in the bank's registry while it runs. ``delete_bank`` first
marks the bank as closing (new work answers 404), cancels every registered
token with reason ``"bank deleted"``, waits until that work has stopped, and
only then deletes the rows and the vector index. So nothing writes into a
deleted bank.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from heed.memory.bank_config.view import BankSettings, settings_of
from heed.memory.embeddings import Embedder, TokenCounter
from heed.memory.learning.extraction import Extraction, Learning
from heed.memory.models import (
    Bank,
    BankStats,
    Conflict,
    DocumentInfo,
    InvalidInput,
    NotFound,
    PreparedDocument,
    PreparedUnit,
    RecallOutcome,
    RecallQuery,
    RetainItem,
    StoredUnit,
    refuse_nul,
)
from heed.memory.recall.pipeline import RecallDeps, StageHook, run_recall
from heed.memory.recall.provenance import with_provenance
from heed.memory.recall.query import check_query
from heed.memory.recall.rerank import Reranker
from heed.memory.recall.vectors import BankIndexes, CurrentIndex, StoreVectors, VectorSearch
from heed.memory.retain.flow import ProgressCallback, RetainsInFlight, RetainSummary
from heed.memory.retain.flow import retain as retain_flow
from heed.memory.retain.idempotency import RetainKey
from heed.memory.retain.prepare import check_items, embed_in_slots
from heed.memory.spans import MEMORY_RECORDS, memory_span
from heed.memory.store import BankGone, MemoryStore, UnitFilter, WriteResult
from heed.memory.views.timeseries import Timeseries, check_period, count_timeseries
from heed.runtime import (
    CancellationToken,
    Lane,
    OperationCancelled,
    current_context,
    raise_if_cancelled,
    run_in_thread,
    use_context,
)

__all__ = [
    "BANK_DELETED",
    "BANK_ID_RE",
    "Learning",
    "MemoryEngine",
    "RetainSummary",
    "is_bank_id",
]

BANK_DELETED: Final = "bank deleted"
#: How long a bank read is answered from memory (see :meth:`MemoryEngine.get_bank`).
BANK_CACHE_SECONDS: Final = 1.0
_BANK_CACHE_SIZE: Final = 4096
BANK_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
"""The one rule for a new bank's id; the HTTP schema declares its pattern, and every path
that creates a bank checks it here (:func:`is_bank_id`). Anchored for JSON Schema, whose
patterns are searched; in Python only ``fullmatch`` is right: with ``match``, ``$`` also
matches before a final newline, so ``"abc\\n"`` would pass."""

T = TypeVar("T")


def is_bank_id(value: str) -> bool:
    """Whether *value*, all of it, is a valid id for a new bank (:data:`BANK_ID_RE`)."""
    return BANK_ID_RE.fullmatch(value) is not None


@dataclass(eq=False)
class _Work:
    token: CancellationToken
    done: asyncio.Event


class MemoryEngine:
    """See the module docstring. Build once per server, on a store whose schema is current
    (the composition root migrates every store before serving: :mod:`heed.services`)."""

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        reranker: Reranker,
        tokens: TokenCounter,
        recall_lane: Lane,
        retain_lane: Lane,
        *,
        max_query_tokens: int = 500,
        max_item_chars: int = 200_000,
        vector_cache_bytes: int = 2 << 30,
        recall_hooks: StageHook | None = None,
        learning: Learning | None = None,
        min_refresh_interval: float = 0.0,
    ) -> None:
        self.store = store
        self.learning = learning or Learning()
        #: ``HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS``: a setting's server default.
        self.min_refresh_interval = min_refresh_interval
        #: Called with the bank after each document a retain wrote into it (consolidation's
        #: scheduler, mental models' triggers: both debounce); must return at once.
        self.after_retain: list[Callable[[Bank], None]] = []
        #: The asynchronous retains writing into each bank (consolidation takes whole rounds
        #: meanwhile).
        self.retains = RetainsInFlight()
        #: Called with the bank after its row (its settings) was saved (budgets look again);
        #: must return at once.
        self.after_bank_change: list[Callable[[Bank], None]] = []
        self.embedder = embedder
        self.tokens = tokens
        self.retain_lane = retain_lane
        self.max_query_tokens = max_query_tokens
        self.max_item_chars = max_item_chars
        self.indexes = BankIndexes(store, embedder.dim, max_bytes=vector_cache_bytes)
        self._work: dict[str, set[_Work]] = {}
        self._closing: set[str] = set()
        self._bank_lock = asyncio.Lock()
        #: Called with the bank before its in-flight work is cancelled (e.g. to cancel
        #: its queued async operations, which have not registered work yet).
        self.before_delete: list[Callable[[Bank], Awaitable[None]]] = []
        self._bank_cache: dict[tuple[str, str], tuple[Bank, float]] = {}
        self.recall_deps = RecallDeps(
            store=store,
            embedder=embedder,
            reranker=reranker,
            tokens=tokens,
            lane=recall_lane,
            index_for=self._index_for,
            hooks=recall_hooks,
        )

    async def _index_for(self, bank: Bank) -> VectorSearch:
        if getattr(self.store, "searches_vectors", False):
            return StoreVectors(self.store, bank.ref)  # type: ignore[arg-type]
        # Loaded and caught up with other processes' writes by the search, in its thread.
        return CurrentIndex(self.indexes, bank.ref)

    # -- in-flight work --------------------------------------------------------------

    @asynccontextmanager
    async def track(self, bank: Bank) -> AsyncIterator[CancellationToken]:
        """Run a block as work on *bank*: a child token registered until the block ends.

        Inside, the active context carries the child token, which ``delete_bank``
        cancels with reason ``"bank deleted"``; such a cancellation surfaces as
        :class:`NotFound` unless the caller's own token was cancelled too.
        """
        if bank.ref in self._closing:
            raise NotFound(f"bank {bank.bank_id!r} not found")
        ctx = current_context()
        token = ctx.token.child()
        work = _Work(token, asyncio.Event())
        self._work.setdefault(bank.ref, set()).add(work)
        try:
            with use_context(ctx.with_token(token)):
                yield token
        except OperationCancelled as exc:
            if exc.reason == BANK_DELETED and not ctx.token.cancelled:
                raise NotFound(f"bank {bank.bank_id!r} was deleted while this request ran") from exc
            raise
        finally:
            token.release_parent()
            work.done.set()
            self._work.get(bank.ref, set()).discard(work)

    @asynccontextmanager
    async def bank_gone_is_not_found(self, bank: Bank) -> AsyncIterator[None]:
        """The one rule for a store's :class:`BankGone` (another process deleted the bank
        after this one looked it up), for every write on a bank: this process forgets what
        it keeps of the bank (its cached row and vector index), and the caller gets
        :class:`NotFound` naming the bank (a 404)."""
        try:
            yield
        except BankGone as exc:
            self._forget(bank)
            raise NotFound(f"bank {bank.bank_id!r} not found (it was deleted)") from exc

    def _forget(self, bank: Bank) -> None:
        self._drop_cached(bank.ref)
        self.indexes.drop(bank.ref)

    def _drop_cached(self, bank_ref: str) -> None:
        """Forget every name (its id, its aliases) under which the bank *bank_ref* is
        cached."""
        for key in [k for k, (b, _) in self._bank_cache.items() if b.ref == bank_ref]:
            self._bank_cache.pop(key, None)

    def forget_name(self, tenant: str, name: str) -> None:
        """Drop what :meth:`get_bank` remembers of the name *name* (a bank id or an alias
        that stopped naming a bank)."""
        self._bank_cache.pop((tenant, name), None)

    def in_flight(self, bank: Bank) -> int:
        """How many pieces of work are running on *bank*."""
        return len(self._work.get(bank.ref, ()))

    # -- banks -------------------------------------------------------------------------

    def settings(self, bank: Bank) -> BankSettings:
        """The settings that apply to *bank*: the one reader of a bank's settings (what
        ``GET .../config`` shows; :mod:`heed.memory.bank_config.view`)."""
        return settings_of(bank, self.learning.defaults(self.min_refresh_interval))

    async def get_bank(self, bank_id: str, *, tenant: str | None = None) -> Bank:
        """The bank of the current tenant; raises :class:`NotFound`. Treat it as read-only.

        A bank read within the last :data:`BANK_CACHE_SECONDS` is answered from memory: every
        request names its bank, and a store read in the offload pool is most of what an
        abandoned request costs. This process's own writes and deletes drop the entry at
        once; another process's are seen within that time, or at once by work that runs
        through :meth:`on_bank`, which reads the bank again when the one it was given is
        gone.
        """
        tenant = tenant or current_context().tenant
        key = (tenant, bank_id)
        cached = self._bank_cache.get(key)
        if cached is not None and time.monotonic() - cached[1] < BANK_CACHE_SECONDS:
            bank: Bank | None = cached[0]
        else:
            bank = await run_in_thread(self.store.get_bank, tenant, bank_id)
            if bank is not None:
                if len(self._bank_cache) >= _BANK_CACHE_SIZE:
                    self._bank_cache.clear()
                self._bank_cache[key] = (bank, time.monotonic())
        if bank is None or bank.ref in self._closing:
            raise NotFound(f"bank {bank_id!r} not found")
        return bank

    async def on_bank(
        self,
        bank_id: str,
        op: Callable[[Bank], Awaitable[T]],
        *,
        found: Callable[[T], bool] | None = None,
    ) -> T:
        """*op* on the current tenant's bank *bank_id*, looked up by :meth:`get_bank` (from
        memory, perhaps), for a caller that names the bank by its id (a request).

        The one rule for a bank that another process deleted, and perhaps created again,
        after this one looked it up: when *op* raises :class:`NotFound` (a write's
        :class:`BankGone` among them) or, given *found*, returns what *found* says found
        nothing, and the bank's row is gone from the store, this process forgets the bank
        (its cached row, its vector index), reads it again and runs *op* once more, on the
        bank that has the id now; :class:`NotFound` when none has. One primary-key read,
        only on those paths. The first try leaves no trace: a write that raised
        :class:`BankGone` wrote nothing, what it wrote before went with the old bank, and a
        read of a gone bank found nothing. A caller bound to
        one bank (a run of the bank's: it must never land in a new bank of the same id)
        calls *op* itself."""
        bank = await self.get_bank(bank_id)
        try:
            result = await op(bank)
        except NotFound:
            if not await self._forget_if_gone(bank):
                raise
        else:
            if found is None or found(result) or not await self._forget_if_gone(bank):
                return result
        return await op(await self.get_bank(bank_id))

    async def _forget_if_gone(self, bank: Bank) -> bool:
        """Whether *bank*'s row is gone from the store; then this process forgets what it
        keeps of it (its cached row and vector index)."""
        if await run_in_thread(self.store.bank_generation, bank.ref) is not None:
            return False
        self._forget(bank)
        return True

    async def find_bank(self, bank_id: str) -> Bank | None:
        """The bank of the current tenant, or ``None``."""
        try:
            return await self.get_bank(bank_id)
        except NotFound:
            return None

    async def put_bank(self, bank_id: str, fields: dict[str, Any], *, create: bool = True) -> Bank:
        """Create the bank (when *create*) or update the given fields. Returns the bank."""
        if not is_bank_id(bank_id):
            raise InvalidInput(
                f"invalid bank_id {bank_id!r}: use 1-128 letters, digits, '.', '_', ':', '@' or '-'"
            )
        tenant = current_context().tenant
        async with self._bank_lock:
            bank = await run_in_thread(self.store.get_bank, tenant, bank_id)
            if bank is not None and bank.ref in self._closing:
                raise Conflict(f"bank {bank_id!r} is being deleted; retry when that finished")
            if bank is None:
                if not create:
                    raise NotFound(f"bank {bank_id!r} not found")
                bank = Bank(tenant=tenant, bank_id=bank_id, ref=str(uuid.uuid4()), name=bank_id)
            for key in ("name", "mission", "background"):
                if fields.get(key) is not None:
                    refuse_nul(fields[key], key)
                    setattr(bank, key, fields[key])
            if fields.get("disposition"):
                bank.disposition.update(fields["disposition"])
            config = fields.get("config") or {}
            bank.config.update({k: v for k, v in config.items() if v is not None})
            try:  # BankGone: deleted by another process since the read above
                async with self.bank_gone_is_not_found(bank):
                    return await self._save_bank(bank)
            except NotFound as exc:
                if not create:
                    raise
                raise Conflict(
                    f"bank {bank_id!r} was deleted while this request ran; retry to create it"
                ) from exc

    async def change_bank(self, bank_id: str, change: Callable[[Bank], None]) -> Bank:
        """Apply *change* to the current tenant's bank *bank_id* and save it, under the lock
        :meth:`put_bank` takes (its settings: :mod:`heed.memory.bank_config.settings`). 404 when the
        bank does not exist (or another process deleted it meanwhile), 409 while it is
        being deleted here."""
        tenant = current_context().tenant
        async with self._bank_lock:
            bank = await run_in_thread(self.store.get_bank, tenant, bank_id)
            if bank is None:
                raise NotFound(f"bank {bank_id!r} not found")
            if bank.ref in self._closing:
                raise Conflict(f"bank {bank_id!r} is being deleted; retry when that finished")
            change(bank)
            async with self.bank_gone_is_not_found(bank):  # deleted by another process since
                return await self._save_bank(bank)

    async def _save_bank(self, bank: Bank) -> Bank:
        """Save *bank*'s row and forget the cached one, after the save: a read racing it
        (consolidation's, say) may have cached the row as it was before."""
        try:
            return await run_in_thread(self.store.save_bank, bank)
        finally:
            self._drop_cached(bank.ref)
            for hook in self.after_bank_change:
                hook(bank)

    async def list_banks(
        self, limit: int, offset: int, search: str | None = None
    ) -> tuple[list[tuple[Bank, int]], int]:
        """The current tenant's banks with their unit counts, and the total; with *search*,
        those whose id, name or an alias holds it (case-insensitively)."""
        tenant = current_context().tenant
        return await run_in_thread(self.store.list_banks, tenant, limit, offset, search)

    async def delete_bank(self, bank_id: str) -> int:
        """Cancel the bank's in-flight work, wait until it stopped, then delete it.

        Returns the number of units deleted.
        """
        bank = await self.get_bank(bank_id)
        with memory_span("delete_memory", bank.bank_id) as span:
            deleted = await self._delete_bank(bank)
            if span.is_recording():
                span.set_attribute(MEMORY_RECORDS, deleted)
            return deleted

    async def _delete_bank(self, bank: Bank) -> int:
        """:meth:`delete_bank` inside its span."""
        self._closing.add(bank.ref)
        self._drop_cached(bank.ref)
        try:
            for hook in self.before_delete:
                await hook(bank)
            works = list(self._work.get(bank.ref, ()))
            for work in works:
                work.token.cancel(BANK_DELETED)
            for work in works:
                await work.done.wait()
            deleted = await run_in_thread(self.store.delete_bank, bank.ref)
            self.indexes.drop(bank.ref)
            return deleted
        finally:
            self._drop_cached(bank.ref)  # read again during the delete?
            self._closing.discard(bank.ref)
            self._work.pop(bank.ref, None)

    async def bank_stats(self, bank_id: str) -> tuple[Bank, BankStats]:
        bank = await self.get_bank(bank_id)
        return bank, await run_in_thread(self.store.bank_stats, bank.ref)

    async def memories_timeseries(
        self, bank_id: str, period: str | None, time_field: str | None
    ) -> tuple[Bank, Timeseries]:
        """The bank's units per time bucket over *period* (:mod:`heed.memory.views.timeseries`);
        :class:`InvalidInput` (400) naming an unknown period."""
        period = check_period(period)
        bank = await self.get_bank(bank_id)
        count = functools.partial(self.store.units_per_time_prefix, bank.ref)
        return bank, await run_in_thread(count_timeseries, period, time_field, count)

    # -- retain ------------------------------------------------------------------------

    def validate_items(self, items: list[RetainItem], document_tags: Sequence[str] = ()) -> None:
        """Refuse what retain does not take (:func:`heed.memory.retain.prepare.check_items`)."""
        check_items(items, document_tags, self.max_item_chars)

    async def retain(
        self,
        bank: Bank,
        items: list[RetainItem],
        document_tags: list[str] | None = None,
        *,
        progress: ProgressCallback | None = None,
        idempotency_key: str | None = None,
        background: bool = False,
    ) -> RetainSummary:
        """Retain *items* into *bank*: one transaction per document.

        Cancellable while queued for a retain slot, while extracting facts, while
        embedding (between batches), and between documents; a document is written whole
        or not at all. *background* says nobody waits on it (an asynchronous retain): its
        model calls and its CPU work (embedding, writing) yield to users' and its model
        calls count against the bank's LLM budget. Under
        *idempotency_key* a retry writes only the documents an earlier attempt did not
        (see :mod:`heed.memory.retain.idempotency`). Raises
        ``OperationCancelled``, :class:`NotFound` if the bank was deleted meanwhile
        (here, or by another process: then by the first document's write, which
        writes nothing), ``IdempotencyConflict`` when the key was used for a
        different request.
        """
        self.validate_items(items, document_tags or ())
        with memory_span("update_memory", bank.bank_id) as span:
            summary = await retain_flow(
                self, bank, items, document_tags or [], progress, idempotency_key, background
            )
            if span.is_recording():
                span.set_attribute(MEMORY_RECORDS, summary.units)
                span.set_attribute("heed.retain.items", summary.items)
                span.set_attribute("heed.retain.documents", summary.documents)
            return summary

    async def embed(self, units: Sequence[PreparedUnit], *, background: bool = False) -> None:
        """Embed and count *units* in place, in retain slots: CPU work, so it takes a slot
        like any (*background*: yields to users': see
        :func:`heed.memory.retain.prepare.embed_in_slots`)."""
        await embed_in_slots(units, self.embedder, self.tokens, self.retain_lane, background)

    def mark_for_consolidation(
        self,
        bank: Bank,
        documents: list[PreparedDocument],
        settings: BankSettings | None = None,
        extraction: Extraction | None = None,
    ) -> None:
        """When *bank* keeps observations, mark what consolidation should take. After an
        *extraction*: its facts, and the verbatim units of chunks no fact could be read
        from (a reply that stayed malformed); the other verbatim units stay retrievable but
        are not consolidated beside the facts stated from them. Without one (extraction
        off, an imported document): the facts, and the units no fact cites."""
        if not (settings or self.settings(bank)).enable_observations:
            return
        for document in documents:
            if extraction is None:
                cited = {i for u in document.units for i in u.source_ids}
                take = [u for u in document.units if u.source_ids or u.id not in cited]
            else:
                take = [u for u in document.units if u.source_ids or u.id in extraction.unread]
            for unit in take:
                unit.consolidation_state = "pending"

    def write_prepared(
        self,
        bank_ref: str,
        document: PreparedDocument,
        ledger: tuple[RetainKey, int] | None = None,
    ) -> WriteResult:
        """Write one prepared document whole (one transaction, rolled back by a cancel) and
        bring the bank's vector index up to it. Blocking; see
        :meth:`~heed.memory.store.MemoryStore.write_document`."""
        raise_if_cancelled()
        result = self.store.write_document(bank_ref, document, ledger)
        self.indexes.apply(bank_ref, result, document)  # committed: the index must follow
        return result

    # -- recall ------------------------------------------------------------------------

    def validate_query(self, query: RecallQuery) -> None:
        """Refuse what recall does not take (:func:`heed.memory.recall.query.check_query`)."""
        check_query(query, self.max_query_tokens, self.tokens)

    async def recall(
        self, bank: Bank, query: RecallQuery, *, background: bool = False
    ) -> RecallOutcome:
        """Run the recall pipeline (see :mod:`heed.memory.recall.pipeline`); *background*
        work (consolidation's) takes a recall slot only when no user's recall waits for
        one (:mod:`heed.runtime.slots`)."""
        self.validate_query(query)
        with memory_span("search_memory", bank.bank_id, query=query.query) as span:
            async with self.track(bank), self.bank_gone_is_not_found(bank):
                settings = self.settings(bank)
                outcome = await run_recall(
                    self.recall_deps, bank, query, settings, background=background
                )
                outcome = await with_provenance(self.store, bank, query, outcome, settings)
            if span.is_recording():  # one call: each takes the span's lock
                span.set_attributes(
                    {
                        MEMORY_RECORDS: len(outcome.hits),
                        "heed.recall.budget": query.budget,
                        "heed.recall.background": background,
                    }
                )
            return outcome

    # -- memories and documents --------------------------------------------------------

    async def list_units(
        self, bank: Bank, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]:
        for name in ("fact_type", "document_id", "search", "entity_id", "start", "end"):
            refuse_nul(getattr(flt, name), name)
        return await run_in_thread(self.store.list_units, bank.ref, flt, limit, offset)

    async def _found(
        self, bank: Bank, what: str, key: str, read: Callable[[str, str], T | None]
    ) -> T:
        """``read(bank.ref, key)`` in a thread; :class:`NotFound` naming *what* (``memory
        'id'``) and the bank when it finds nothing."""
        found = await run_in_thread(read, bank.ref, key)
        if found is None:
            raise NotFound(f"{what} not found in bank {bank.bank_id!r}")
        return found

    async def _delete(
        self,
        bank: Bank,
        what: str,
        key: str,
        delete: Callable[[str, str], WriteResult | None],
    ) -> WriteResult:
        """``delete(bank.ref, key)`` as a tracked write of *bank* (a bank deleted meanwhile:
        :class:`NotFound`), then its removals applied to the bank's vector indexes;
        :class:`NotFound` naming *what* when there was nothing to delete."""
        async with self.track(bank), self.bank_gone_is_not_found(bank):
            result = await self._found(bank, what, key, delete)
            await run_in_thread(self.indexes.apply, bank.ref, result, None)
            return result

    async def get_unit(self, bank: Bank, unit_id: str) -> StoredUnit:
        refuse_nul(unit_id, "the memory id")
        return await self._found(bank, f"memory {unit_id!r}", unit_id, self.store.get_unit)

    async def delete_unit(self, bank: Bank, unit_id: str) -> None:
        refuse_nul(unit_id, "the memory id")
        with memory_span("delete_memory", bank.bank_id, record_id=unit_id):
            await self._delete(bank, f"memory {unit_id!r}", unit_id, self.store.delete_unit)

    async def list_documents(
        self, bank: Bank, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]:
        refuse_nul(search, "search")
        return await run_in_thread(self.store.list_documents, bank.ref, search, limit, offset)

    async def get_document(self, bank: Bank, document_id: str) -> DocumentInfo:
        refuse_nul(document_id, "document_id")
        what = f"document {document_id!r}"
        return await self._found(bank, what, document_id, self.store.get_document)

    async def delete_document(self, bank: Bank, document_id: str) -> int:
        refuse_nul(document_id, "document_id")
        what = f"document {document_id!r}"
        with memory_span("delete_memory", bank.bank_id, record_id=document_id) as span:
            result = await self._delete(bank, what, document_id, self.store.delete_document)
            if span.is_recording():
                span.set_attribute(MEMORY_RECORDS, len(result.removed))
        return len(result.removed)
