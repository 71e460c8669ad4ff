"""Retain: items -> documents of memory units (split, entities, dates, embeddings).

:func:`prepare_documents` is blocking and runs in the offload: it groups items
into documents, splits them into units, extracts entities and dates, and
embeds every unit (the embedder checks the token between batches). Writing is
the engine's job, one transaction per document.

Grouping: items sharing a ``document_id`` form one document (the first item's
``update_mode`` decides replace or append; replace is the default, as in
Hindsight); an item without one is its own document with a fresh id, or, under an
idempotency key, an id derived from the key and the item's position (see
:mod:`heed.memory.retain.idempotency`).
"""

from __future__ import annotations

import asyncio
import heapq
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from heed.memory.dates import find_dates
from heed.memory.embeddings import Embedder, TokenCounter
from heed.memory.entities import assign_given, extract_entities
from heed.memory.models import (
    Chunk,
    InvalidInput,
    PreparedDocument,
    PreparedUnit,
    RetainItem,
    refuse_nul,
)
from heed.memory.retain.idempotency import document_id_for
from heed.memory.retain.units import index_text, neighbour_texts, split_units, with_neighbours
from heed.runtime import Lane, raise_if_cancelled, run_all, run_in_thread, wait_for_event

__all__ = [
    "DocumentPlan",
    "EmbedFeed",
    "check_items",
    "embed_documents",
    "embed_in_slots",
    "embed_units",
    "plan_documents",
    "prepare_documents",
    "split_documents",
]


@dataclass(slots=True)
class DocumentPlan:
    """Items of one document, in request order."""

    document_id: str
    replace: bool
    items: list[RetainItem]
    tags: list[str]


def plan_documents(
    items: list[RetainItem], document_tags: list[str], key: str | None = None
) -> list[DocumentPlan]:
    """Group items into documents (see the module docstring). Linear in the items' tags."""
    plans: dict[str, DocumentPlan] = {}
    order: list[DocumentPlan] = []
    for position, item in enumerate(items):
        if item.document_id is None:
            new_id = document_id_for(key, position) if key is not None else str(uuid.uuid4())
            plan = DocumentPlan(new_id, True, [item], list(document_tags))
            order.append(plan)
            continue
        plan_or_none = plans.get(item.document_id)
        if plan_or_none is None:
            plan_or_none = DocumentPlan(
                item.document_id, item.update_mode == "replace", [], list(document_tags)
            )
            plans[item.document_id] = plan_or_none
            order.append(plan_or_none)
        plan_or_none.items.append(item)
    for plan in order:  # the document's tags: its own, then its items', first seen first
        plan.tags = list(dict.fromkeys([*plan.tags, *(t for i in plan.items for t in i.tags)]))
    return order


def _units_of(
    item: RetainItem, chunk_index: int, document_tags: list[str], now: datetime
) -> list[PreparedUnit]:
    when: datetime | None = None if item.timestamp_unset else (item.timestamp or now)
    units: list[PreparedUnit] = []
    tags = list(dict.fromkeys([*document_tags, *item.tags]))
    metadata = dict(item.metadata)  # one object for all the item's units: stored once
    pieces = split_units(item.content)
    given = assign_given([piece.text for piece in pieces], item.entities)
    for piece, entities in zip(pieces, given, strict=True):
        dates = find_dates(piece.text, when)
        start: datetime | None
        end: datetime | None
        if dates:
            start = min(d.start for d in dates)
            end = max(d.end for d in dates)
        else:
            start = end = when
        units.append(
            PreparedUnit(
                id=str(uuid.uuid4()),
                text=piece.text,
                index_text=index_text(piece.text, item.context, when),
                fact_type=item.fact_type,
                context=item.context,
                chunk_index=chunk_index,
                occurred_start=start,
                occurred_end=end,
                mentioned_at=when,
                metadata=metadata,
                tags=tags,
                entities=extract_entities(piece.text, entities, piece.speaker),
            )
        )
    return units


def _index_neighbours(units: list[PreparedUnit]) -> None:
    """Add each unit's neighbours in its document to its BM25 text (see heed.memory.retain.units).

    An append's first units and the document's stored last units are joined by the store,
    which alone knows those (:func:`heed.memory.retain.units.neighbour_gains`)."""
    texts = [u.text for u in units]
    for position, unit in enumerate(units):
        unit.index_text = with_neighbours(unit.index_text, neighbour_texts(texts, position))


def split_documents(plans: list[DocumentPlan]) -> list[PreparedDocument]:
    """Split every document of *plans* into units with their entities and dates, not yet
    embedded. Blocking; checks the token."""
    now = datetime.now(UTC)
    documents: list[PreparedDocument] = []
    for plan in plans:
        raise_if_cancelled()
        chunks: list[Chunk] = []
        units: list[PreparedUnit] = []
        for index, item in enumerate(plan.items):
            chunks.append(Chunk(id=str(uuid.uuid4()), index=index, text=item.content))
            units.extend(_units_of(item, index, plan.tags, now))
        _index_neighbours(units)
        first = plan.items[0]
        documents.append(
            PreparedDocument(
                document_id=plan.document_id,
                replace=plan.replace,
                original_text="\n".join(item.content for item in plan.items),
                metadata=dict(first.metadata),
                tags=plan.tags,
                chunks=chunks,
                units=units,
            )
        )
    return documents


def embed_documents(
    documents: list[PreparedDocument], embedder: Embedder, tokens: TokenCounter | None = None
) -> list[PreparedDocument]:
    """Embed (and count the tokens of) every unit of *documents*, in place; returns them.
    Blocking; the embedder checks the token between batches."""
    embed_units([u for d in documents for u in d.units], embedder, tokens)
    return documents


def embed_units(
    all_units: Sequence[PreparedUnit], embedder: Embedder, tokens: TokenCounter | None = None
) -> None:
    """Embed (and count the tokens of) *all_units*, in place. Blocking; the embedder checks
    the token between batches."""
    if not all_units:
        return
    vectors = embedder.embed([u.text for u in all_units])
    for unit, vector in zip(all_units, vectors, strict=True):
        unit.embedding = vector
    if tokens is not None:
        raise_if_cancelled()
        counts = tokens.count_many([u.text for u in all_units])
        for unit, count in zip(all_units, counts, strict=True):
            unit.token_count = count


#: Seconds without users' CPU work after which background embedding may use the slot kept
#: for them (:func:`embed_in_slots`).
LEND_AFTER_QUIET: Final = 1.0
#: The units background embedding holds a core for while users wait for one (tens of
#: milliseconds).
CONTENDED_PIECE: Final = 8


async def embed_in_slots(
    units: Sequence[PreparedUnit],
    embedder: Embedder,
    tokens: TokenCounter | None,
    lane: Lane,
    background: bool = False,
) -> None:
    """Embed and count *units* in place, in slots of *lane* (CPU work). *background* work
    yields to users': in pieces of :data:`CONTENDED_PIECE` units while users wait for a
    core (it was granted its slot by aging), and in the slot kept for users while none has
    wanted a core for :data:`LEND_AFTER_QUIET` seconds (:meth:`heed.runtime.Lane.lent_slot`;
    *units* should then be a short piece, such as an :class:`EmbedFeed`'s). Raises
    ``OperationCancelled`` while waiting for a slot or between batches."""
    if background and units:
        with lane.lent_slot(LEND_AFTER_QUIET) as lent:
            if lent:
                await run_in_thread(embed_units, units, embedder, tokens)
                return
    while units:
        async with lane.slot(background=background):
            # Users waiting for a core: a shorter hold, the rest after their turn.
            take = units[:CONTENDED_PIECE] if background and lane.users_waiting() else units
            await run_in_thread(embed_units, take, embedder, tokens)
        units = units[len(take) :]


def prepare_documents(
    plans: list[DocumentPlan], embedder: Embedder, tokens: TokenCounter | None = None
) -> list[PreparedDocument]:
    """Split, extract, count and embed every document of *plans*. Blocking; checks the token."""
    return embed_documents(split_documents(plans), embedder, tokens)


def _refuse_nul_in_item(item: RetainItem, where: str) -> None:
    refuse_nul(item.content, f"{where}.content")
    refuse_nul(item.context, f"{where}.context")
    refuse_nul(item.document_id, f"{where}.document_id")
    refuse_nul(item.fact_type, f"{where}.fact_type")
    for i, tag in enumerate(item.tags):
        refuse_nul(tag, f"{where}.tags[{i}]")
    for key, value in item.metadata.items():
        refuse_nul(key, f"a key of {where}.metadata")
        refuse_nul(value, f"{where}.metadata[{key!r}]")
    for i, entity in enumerate(item.entities):
        refuse_nul(entity.name, f"{where}.entities[{i}].text")
        refuse_nul(entity.type, f"{where}.entities[{i}].type")


def check_items(
    items: Sequence[RetainItem], document_tags: Sequence[str], max_item_chars: int
) -> None:
    """Refuse empty or oversized (over *max_item_chars*) items, and text holding NUL (which
    no store keeps: :class:`heed.errors.InvalidText`), with an :class:`InvalidInput`
    naming the item and field."""
    if not items:
        raise InvalidInput("items is empty: send at least one item")
    for i, tag in enumerate(document_tags):
        refuse_nul(tag, f"document_tags[{i}]")
    for i, item in enumerate(items):
        if not item.content.strip():
            raise InvalidInput(f"items[{i}].content is empty")
        if len(item.content) > max_item_chars:
            raise InvalidInput(
                f"items[{i}].content has {len(item.content)} characters; "
                f"the limit is {max_item_chars}"
            )
        _refuse_nul_in_item(item, f"items[{i}]")


#: The units :class:`EmbedFeed` embeds in one CPU slot: about a tenth of a second of one
#: core, so a user's request waiting for the slot (when it is background work) waits that
#: long at most, and larger pieces would save little (one embedder batch).
FEED_PIECE: Final = 32


class EmbedFeed:
    """Units to embed as they come (each document's turns, then its facts as the model
    states them), embedded by :meth:`run` while the rest of the retain waits on the network.

    The units of the lowest *key* queued go first (a retain's documents in order, so the
    first ones are ready to write first), in pieces of at most :data:`FEED_PIECE` units of
    one key, at most *parallel* pieces side by side, each in its own CPU slot (*embed*
    takes one); *on_embedded* is told ``(key, count)`` after each piece. Whoever feeds it
    calls :meth:`close` when nothing more will come; :meth:`run` returns once everything fed
    is embedded, and raises what *embed* raises (``OperationCancelled`` included; it also
    stops waiting for more when the token is cancelled). Used from one event loop."""

    def __init__(
        self,
        embed: Callable[[list[PreparedUnit]], Awaitable[None]],
        parallel: int = 1,
        on_embedded: Callable[[int, int], object] | None = None,
    ) -> None:
        self._embed = embed
        self._parallel = max(1, parallel)
        self._on_embedded = on_embedded
        self._queued: dict[int, list[PreparedUnit]] = {}
        self._keys: list[int] = []  # a heap of the keys with units queued
        self._more = asyncio.Event()
        self._closed = False

    def put(self, units: Sequence[PreparedUnit], key: int = 0) -> None:
        """Embed *units* too, in the order of *key* (returns at once)."""
        if not units:
            return
        queue = self._queued.get(key)
        if queue is None:
            queue = self._queued[key] = []
            heapq.heappush(self._keys, key)
        queue.extend(units)
        self._more.set()

    def close(self) -> None:
        """Nothing more will be put."""
        self._closed = True
        self._more.set()

    async def run(self) -> None:
        """Embed what is put until closed and drained."""
        await run_all([self._work] * self._parallel, self._parallel)

    def _next(self) -> tuple[int, list[PreparedUnit]] | None:
        """The next piece to embed and its key, taken out of the queue, or ``None``."""
        if not self._keys:
            return None
        key = self._keys[0]
        queue = self._queued[key]
        piece, rest = queue[:FEED_PIECE], queue[FEED_PIECE:]
        if rest:
            self._queued[key] = rest
        else:
            del self._queued[key]
            heapq.heappop(self._keys)
        return key, piece

    async def _work(self) -> None:
        while True:
            taken = self._next()
            if taken is None:
                if self._closed:
                    return
                self._more.clear()
                await wait_for_event(self._more, None)
                continue
            key, piece = taken
            await self._embed(piece)
            if self._on_embedded is not None:
                self._on_embedded(key, len(piece))
