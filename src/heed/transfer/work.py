"""The blocking halves of a bank transfer (:mod:`heed.transfer.service` runs them in the
offload): a bank into an archive (:func:`write_archive`), an archive into a staging bank
(:func:`import_archive`). Both go through the store's bank rows
(:class:`heed.transfer.store.TransferStore`) and the archive's container
(:mod:`heed.transfer.archive`) a page at a time, checking the token between pages, and report
progress to a :class:`Progress`.

Two rules live here: the keyword text a memory gets when the store could not read it back
(PostgreSQL keeps only a ``tsvector``: :func:`with_index_texts` rebuilds it by the rule of
retain and consolidation, :mod:`heed.memory.retain.units`), and the new ids an import gives
(:class:`NewIds`: UUID 5 of the new bank and the old id, so no id is ever reused and the
same archive imports twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import IO, Any, Final, Literal, Protocol

from heed.memory.bank_config import settings as bank_config
from heed.memory.directives.rules import MAX_DIRECTIVES
from heed.memory.mental_models import KnowledgeFolder
from heed.memory.models import Bank, Chunk, EntityRef, InvalidInput, PreparedDocument, PreparedUnit
from heed.memory.retain.units import index_text, neighbour_texts, with_neighbours
from heed.memory.store import MemoryStore, MentalModelStore
from heed.runtime import raise_if_cancelled
from heed.transfer.archive import (
    ArchiveLimits,
    ArchiveReader,
    ArchiveWriter,
    InvalidArchive,
)
from heed.transfer.check import check_embedder
from heed.transfer.rows import (
    BankSelection,
    DocumentRow,
    MembershipRow,
    MentalModelRow,
    UnitRow,
)
from heed.transfer.store import TransferStore
from heed.webhooks.models import Webhook
from heed.webhooks.service import Webhooks

__all__ = [
    "CONFLICTS",
    "IMPORT_BATCH",
    "Carried",
    "Flags",
    "NewIds",
    "Progress",
    "bank_settings",
    "check_embedder",
    "import_archive",
    "merge_archive",
    "with_index_texts",
    "write_archive",
]

#: Memories written per batch on import (a cancel waits for at most one: a few ms).
IMPORT_BATCH: Final = 32
#: What a merge does with a document whose id the bank holds: leave the bank's (``skip``),
#: put the archive's in its place (``replace``), or keep both, the archive's under a new id
#: (``new-id``).
CONFLICTS: Final = ("skip", "replace", "new-id")
#: The sections *include_data* covers.
_DATA_SECTIONS: Final = (
    "documents",
    "units",
    "observations",
    "entities",
    "unit_entities",
    "links",
)
#: The namespace of the ids an import gives.
_ID_NAMESPACE: Final = uuid.UUID("1b1f7c2e-3a55-4d1e-9e65-7c3c6d1f0a42")


@dataclass(frozen=True, slots=True)
class Flags:
    """What a transfer carries: the memories and what backs them (*include_data*); the
    bank's settings, directives, webhooks, mental models and knowledge base
    (*include_bank_config*); a documents archive's mental models and knowledge base
    (*include_knowledge_base*: export only)."""

    include_data: bool = True
    include_bank_config: bool = True
    include_knowledge_base: bool = False

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Flags:
        return cls(
            bool(payload["include_data"]),
            bool(payload["include_bank_config"]),
            bool(payload.get("include_knowledge_base", False)),
        )


@dataclass(frozen=True, slots=True)
class Carried:
    """Where a transfer reads and writes what is not the memory store's: the mental
    models and knowledge base (*knowledge*), the webhooks (*webhooks*). A part that is
    ``None`` is neither exported nor imported."""

    knowledge: MentalModelStore | None = None
    webhooks: Webhooks | None = None


class Progress(Protocol):
    """Where a transfer reports how far it is (called from its worker thread)."""

    def start(self, stage: str, total: int) -> None: ...

    def add(self, n: int) -> None: ...


class NewIds:
    """The new ids an import gives an archive's memories, chunks and entities."""

    def __init__(self, bank_ref: str) -> None:
        self.prefix = _ID_NAMESPACE.bytes + (bank_ref + "/").encode()

    def __call__(self, old: str) -> str:
        """``uuid5(_ID_NAMESPACE, bank_ref + "/" + old)``, without the UUID object (an
        import maps every id several times: it was a tenth of its CPU)."""
        raw = bytearray(hashlib.sha1(self.prefix + old.encode()).digest()[:16])
        raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
        x = raw.hex()
        return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"

    def unit(self, unit: UnitRow) -> UnitRow:
        """*unit* with its id, chunk id and provenance mapped."""
        unit.id = self(unit.id)
        unit.chunk_id = self(unit.chunk_id) if unit.chunk_id is not None else None
        unit.source_ids = [self(s) for s in unit.source_ids]
        return unit


def pages(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """*rows* in lists of at most *size*."""
    iterator = iter(rows)
    while page := list(itertools.islice(iterator, size)):
        yield page


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value)
    return None


def _rebuilt(units: list[UnitRow]) -> None:
    """Give *units* (one document's, in order, or observations) the keyword text retain
    and consolidation give (:mod:`heed.memory.retain.units`) where the store could not read it
    back: a document's units their text, context and date, and its verbatim units (those
    resting on no other) the neighbours among them; an observation its text."""
    verbatim = [u for u in units if u.document_id is not None and not u.source_ids]
    texts = [u.text for u in verbatim]
    position = {id(u): i for i, u in enumerate(verbatim)}
    for unit in units:
        if unit.index_text is not None:
            continue
        if unit.document_id is None:
            unit.index_text = index_text(unit.text, None, None)
            continue
        base = index_text(unit.text, unit.context, _when(unit.mentioned_at))
        at = position.get(id(unit))
        unit.index_text = base if at is None else with_neighbours(base, neighbour_texts(texts, at))


def with_index_texts(units: Iterator[list[UnitRow]], size: int) -> Iterator[list[UnitRow]]:
    """Pages of *units*, each document's given its keyword text where missing
    (:func:`_rebuilt`, which needs a whole document: pages are regrouped by document)."""
    flat = (unit for page in units for unit in page)
    for _, group in itertools.groupby(flat, key=lambda u: u.document_id):
        mine = list(group)
        if any(u.index_text is None for u in mine):
            _rebuilt(mine)
        yield from pages(mine, size)


def bank_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The bank settings of an archive's ``config``, checked by the rule every setting
    meets (:func:`heed.memory.bank_config.settings.validate`: a name heed does not
    honour, or a value
    of the wrong type, is refused by name)."""
    try:
        checked = bank_config.validate(config, where="bank.json: config")
    except InvalidInput as exc:
        raise InvalidArchive(exc.message) from exc
    return {name: value for name, value in checked.items() if value is not None}


def write_archive(
    store: MemoryStore,
    rows: TransferStore,
    target: IO[bytes],
    bank: Bank,
    selection: BankSelection,
    flags: Flags,
    scope: Literal["bank", "documents"],
    progress: Progress,
    *,
    model: str,
    dim: int,
    batch: int,
    carried: Carried,
    compress: bool = True,
    content: Callable[[bytes], object] | None = None,
) -> dict[str, int]:
    """Write *bank* (its *selection*) as an archive into *target*; the records per
    section. *content* is fed the records' bytes (:class:`ArchiveWriter`). Blocking;
    checks the token between pages."""
    writer = ArchiveWriter(
        target,
        scope=scope,
        source_bank_id=bank.bank_id,
        embedding_model=model,
        dim=dim,
        compress=compress,
        content=content,
    )
    try:
        if scope == "bank":
            profile = replace(bank, config=dict(bank.config), disposition=dict(bank.disposition))
            if not flags.include_bank_config:
                profile.config, profile.mission = {}, ""
                profile.disposition = {"skepticism": 3, "literalism": 3, "empathy": 3}
            writer.bank(profile)
            if flags.include_bank_config:
                writer.write("directives", store.list_directives(bank.ref))
                if carried.webhooks is not None:
                    writer.write("webhooks", carried.webhooks.bank_webhooks(bank))
        knowledge = flags.include_bank_config if scope == "bank" else flags.include_knowledge_base
        if knowledge and carried.knowledge is not None:
            _write_knowledge(writer, carried.knowledge, bank.ref)
        if flags.include_data:
            with rows.read_bank(bank.ref, selection) as reader:
                progress.start("export", reader.count_units())
                for documents in reader.documents(max(1, batch // 8)):
                    writer.write("documents", documents)
                for units in with_index_texts(reader.units(batch), batch):
                    writer.write("units", units)
                    progress.add(len(units))
                for units in with_index_texts(reader.observations(batch), batch):
                    writer.write("observations", units)
                    progress.add(len(units))
                for section, found in (
                    ("entities", reader.entities(batch)),
                    ("unit_entities", reader.memberships(batch)),
                    ("links", reader.links(batch)),
                ):
                    for page in found:
                        writer.write(section, page)
        manifest = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return {name: manifest.records(name) for name in manifest.sections if name != "bank"}


def _write_knowledge(writer: ArchiveWriter, store: MentalModelStore, bank_ref: str) -> None:
    """The bank's knowledge-base folders, then its mental models with their history."""
    writer.write("knowledge_folders", store.knowledge_folders(bank_ref))
    for page in pages(store.mental_models(bank_ref, with_embeddings=True), 32):
        writer.write(
            "mental_models",
            [MentalModelRow(m, store.mental_model_history(bank_ref, m.id)) for m in page],
        )


def _import_knowledge(
    reader: ArchiveReader, store: MentalModelStore | None, bank_ref: str
) -> dict[str, int]:
    """The archive's folders and mental models into the bank *bank_ref*, as they are
    (:func:`heed.transfer.check.check_archive` checked their tree)."""
    if store is None:
        if reader.manifest.records("mental_models") or reader.manifest.records("knowledge_folders"):
            raise InvalidInput("this server cannot import mental models")
        return {}
    folders: list[KnowledgeFolder] = list(reader.rows("knowledge_folders"))
    for folder in folders:
        folder.bank_ref = bank_ref
    counts = {"knowledge_folders": store.write_knowledge_rows(bank_ref, folders, [])}
    counts["mental_models"] = 0
    for page in pages(reader.rows("mental_models"), 32):
        for row in page:
            row.model.bank_ref = bank_ref
        counts["mental_models"] += store.write_knowledge_rows(bank_ref, [], page)
    return counts


def _import_webhooks(
    reader: ArchiveReader, carrier: Webhooks | None, target: Bank
) -> dict[str, int]:
    webhooks: list[Webhook] = list(reader.rows("webhooks"))
    if not webhooks:
        return {}
    if carrier is None:
        raise InvalidInput("this server cannot import webhooks")
    carrier.check_carried(webhooks)
    return {"webhooks": carrier.stage_carried(webhooks, target)}


def _counted(units: Iterator[list[UnitRow]], progress: Progress) -> Iterator[list[UnitRow]]:
    for page in units:
        yield page
        progress.add(len(page))


def import_archive(
    store: MemoryStore,
    rows: TransferStore,
    archive: IO[bytes],
    staging: Bank,
    target: Bank,
    flags: Flags,
    progress: Progress,
    *,
    limits: ArchiveLimits,
    model: str,
    dim: int,
    batch: int,
    carried: Carried,
) -> dict[str, int]:
    """Write *archive* into the bank *staging*, and give *target* (the bank to publish)
    the archive's profile and settings; the rows written per section. Webhooks are staged
    as *target*'s under the staging bank's ref (it keeps it when published); a failed
    import discards them with :meth:`Webhooks.discard_carried`. Blocking; checks
    the token between batches."""
    ids = NewIds(staging.ref)
    counts: dict[str, int] = {}
    with ArchiveReader(archive, limits) as reader:
        check_embedder(reader.manifest, model, dim)
        record = reader.bank()
        target.name = target.bank_id
        if record is not None:
            if record.name not in ("", record.bank_id):  # else named by its new id
                target.name = record.name
            target.background = record.background
            if flags.include_bank_config:
                target.mission = record.mission
                target.disposition = record.disposition.model_dump()
                target.config = bank_settings(record.config)
                counts["directives"] = 0
                for directive in reader.rows("directives"):
                    directive.id, directive.bank_ref = ids(directive.id), staging.ref
                    if store.create_directive(directive, MAX_DIRECTIVES) is None:
                        raise InvalidArchive(f"more than {MAX_DIRECTIVES} directives")
                    counts["directives"] += 1
        if flags.include_bank_config:
            counts |= _import_knowledge(reader, carried.knowledge, staging.ref)
            counts |= _import_webhooks(reader, carried.webhooks, target)  # ref: staging's
        if not flags.include_data:
            return counts
        total = sum(s.records for n, s in reader.manifest.sections.items() if n in _DATA_SECTIONS)
        progress.start("import", total)
        units = reader.rows("units")
        counts["documents"] = counts["units"] = 0
        for document in reader.rows("documents"):
            assert isinstance(document, DocumentRow)
            document.chunks = [replace(c, id=ids(c.id)) for c in document.chunks]
            mine = (ids.unit(u) for u in itertools.islice(units, document.unit_count))
            batches = _counted(pages(mine, IMPORT_BATCH), progress)
            counts["units"] += rows.write_document_rows(staging.ref, document, batches)
            counts["documents"] += 1
            progress.add(1)
        if next(units, None) is not None:
            raise InvalidArchive("the units section holds memories of no document")
        counts["observations"] = 0
        for page in pages(reader.rows("observations"), IMPORT_BATCH):
            counts["observations"] += rows.write_unit_rows(staging.ref, [ids.unit(u) for u in page])
            progress.add(len(page))
        counts["entities"] = 0
        for page in pages(reader.rows("entities"), batch):
            counts["entities"] += rows.write_entity_rows(
                staging.ref, [replace(e, id=ids(e.id)) for e in page]
            )
            progress.add(len(page))
        counts["unit_entities"] = 0
        for page in pages(reader.rows("unit_entities"), batch):
            counts["unit_entities"] += rows.write_membership_rows(
                staging.ref, [MembershipRow(ids(m.unit_id), ids(m.entity_id)) for m in page]
            )
            progress.add(len(page))
        counts["links"] = 0
        for page in pages(reader.rows("links"), batch):
            moved = [replace(k, from_id=ids(k.from_id), to_id=ids(k.to_id)) for k in page]
            counts["links"] += rows.write_link_rows(staging.ref, moved)
            progress.add(len(page))
    raise_if_cancelled()
    return counts


# -- merge ------------------------------------------------------------------------------------


def _archive_graph(
    reader: ArchiveReader,
) -> tuple[dict[str, list[EntityRef]], dict[str, list[str]]]:
    """What a merge needs of the archive's graph: each memory's entities (by name, to be
    resolved against the bank's), and each memory's causal partners (a fact that caused
    another)."""
    entities = {e.id: EntityRef(e.name, e.type) for e in reader.rows("entities")}
    named: dict[str, list[EntityRef]] = {}
    for row in reader.rows("unit_entities"):
        named.setdefault(row.unit_id, []).append(entities[row.entity_id])
    causes: dict[str, list[str]] = {}
    for link in reader.rows("links"):
        if link.link_type == "causal":
            causes.setdefault(link.from_id, []).append(link.to_id)
    return named, causes


def _prepared(
    document: DocumentRow,
    units: list[UnitRow],
    document_id: str,
    conflict: str,
    ids: NewIds,
    named: dict[str, list[EntityRef]],
    causes: dict[str, list[str]],
) -> PreparedDocument:
    """An archive's document as a retain writes one: new ids, chunks by index, entities by
    name, provenance and causes within the document."""
    chunk_index = {c.id: c.chunk_index for c in document.chunks}
    position = {u.id: i for i, u in enumerate(units)}
    prepared = [
        PreparedUnit(
            id=ids(u.id),
            text=u.text,
            index_text=u.index_text if u.index_text is not None else u.text,
            fact_type=u.fact_type,
            context=u.context,
            chunk_index=chunk_index.get(u.chunk_id, -1) if u.chunk_id is not None else -1,
            occurred_start=_when(u.occurred_start),
            occurred_end=_when(u.occurred_end),
            mentioned_at=_when(u.mentioned_at),
            metadata=dict(u.metadata),
            tags=list(u.tags),
            entities=named.get(u.id, []),
            embedding=u.vector,
            token_count=u.token_count,
            source_ids=[ids(i) for i in u.source_ids if i in position],
            caused_by=[  # one way: the links are written both ways
                ids(i) for i in causes.get(u.id, []) if position.get(i, len(units)) < position[u.id]
            ],
        )
        for u in units
    ]
    return PreparedDocument(
        document_id=document_id,
        replace=conflict == "replace",
        original_text=document.original_text,
        metadata=dict(document.metadata),
        tags=list(document.tags),
        chunks=[Chunk(ids(c.id), c.chunk_index, c.text) for c in document.chunks],
        units=prepared,
    )


def merge_archive(
    archive: IO[bytes],
    conflict: str,
    ids: NewIds,
    progress: Progress,
    *,
    limits: ArchiveLimits,
    held: Callable[[str], bool],
    write: Callable[[PreparedDocument], None],
    model: str,
    dim: int,
) -> dict[str, int]:
    """Fold the archive's documents into a bank (see :mod:`heed.transfer.service`): each
    document is written whole by *write* (a retain's write: one transaction, entities
    resolved against the bank's by name, links made as a retain makes them), or skipped,
    or renamed, by *conflict* when *held* says the bank holds its id. Observations, the
    bank's settings and its knowledge are not merged. Blocking; checks the token between
    documents (and *write* inside one)."""
    counts = {"documents": 0, "units": 0, "skipped": 0, "renamed": 0, "replaced": 0}
    with ArchiveReader(archive, limits) as reader:
        check_embedder(reader.manifest, model, dim)
        named, causes = _archive_graph(reader)
        progress.start("merge", reader.manifest.records("documents"))
        units = reader.rows("units")
        for document in reader.rows("documents"):
            raise_if_cancelled()
            mine: list[UnitRow] = list(itertools.islice(units, document.unit_count))
            document_id = document.document_id
            if held(document_id):
                if conflict == "skip":
                    counts["skipped"] += 1
                    progress.add(1)
                    continue
                if conflict == "new-id":
                    document_id = _free_id(document_id, ids, held)
                    counts["renamed"] += 1
                else:
                    counts["replaced"] += 1
            write(_prepared(document, mine, document_id, conflict, ids, named, causes))
            counts["documents"] += 1
            counts["units"] += len(mine)
            progress.add(1)
        counts["observations_not_merged"] = reader.manifest.records("observations")
    return counts


def _free_id(document_id: str, ids: NewIds, held: Callable[[str], bool]) -> str:
    """A new id for an archive's document whose id the bank holds: its id and a suffix of
    this merge's (a second suffix if even that is held)."""
    candidate = f"{document_id}-{ids(document_id)[:8]}"
    n = 2
    while held(candidate):
        candidate = f"{document_id}-{ids(document_id)[:8]}-{n}"
        n += 1
    return candidate
