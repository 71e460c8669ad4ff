"""The whole check of an uploaded bank archive, in memory that does not follow its size.

:class:`~heed.transfer.archive.ArchiveReader` checks the container and
:mod:`heed.transfer.records` one record at a time; :func:`check_archive` reads every
record once more and checks what spans records: unique ids (memories, documents, chunks,
entities, entity names, directives, webhooks, knowledge-base nodes), a document's units
following it in order and in number, chunks, entities and memories referenced where they
exist, record counts as the manifest declares, the knowledge base's tree.

**Memory.** A hostile archive may hold millions of long ids: keeping them as Python strings
took hundreds of megabytes that were not returned after the 400. Here an id is kept as an
8-byte digest (BLAKE2b keyed with a random key per check, so an archive cannot be crafted
to collide) in a packed array (:class:`IdDigests`), duplicates are found by sorting, and
references are looked up in the sorted digests in batches. The mental models and folders
(at most :data:`~heed.memory.mental_models.MAX_MENTAL_MODELS` each) are kept as their tree
fields only, never whole. So a check holds, whatever the archive declares or holds:

- 8 bytes per id-bearing record (at most :attr:`ArchiveLimits.max_records` records in all),
- one record at a time (:attr:`ArchiveLimits.max_record_bytes` bytes, and at most
  :attr:`ArchiveLimits.max_record_values` JSON values, checked before it is decoded),
- the current document's chunk ids, a batch of references, the tree of the knowledge base.

Every refusal is an :class:`~heed.transfer.records.InvalidArchive` (400) naming the
problem; a duplicate id is named by reading its section again (only on that refusal).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, Final, NamedTuple

import numpy as np

from heed.memory.directives.rules import MAX_DIRECTIVES
from heed.memory.entities import canonical
from heed.memory.mental_models import MAX_MENTAL_MODELS, MAX_NODE_DEPTH, KnowledgeFolder
from heed.runtime import ChildFd, raise_if_cancelled
from heed.transfer.archive import MANIFEST, MAX_WEBHOOKS, ArchiveLimits, ArchiveReader, Manifest
from heed.transfer.records import BankRecord, InvalidArchive
from heed.transfer.rows import DocumentRow, EntityRow, MentalModelRow, UnitRow
from heed.webhooks.models import Webhook

__all__ = [
    "ArchiveCheck",
    "IdDigests",
    "KnowledgeNode",
    "check_archive",
    "check_archive_file",
    "check_embedder",
    "check_knowledge",
]

#: References looked up at once in the sorted digests.
_BATCH: Final = 4096


class IdDigests:
    """A set of ids kept as 8-byte keyed digests in a packed array (8 bytes an id).

    :meth:`add` appends; :meth:`seal` sorts and returns a digest held twice (or ``None``);
    :meth:`missing` tells which of some values are not held (after :meth:`seal`). A digest
    is 64 bits of BLAKE2b keyed with a key drawn per set: two different ids share one with
    a probability of about n^2 / 2^65 (1e-6 for 6 million ids) and nobody can aim for it.
    """

    def __init__(self) -> None:
        self._key = os.urandom(16)
        self._values = array("Q")
        self._sorted: np.ndarray[Any, np.dtype[np.uint64]] | None = None

    def __len__(self) -> int:
        return len(self._values)

    def digest(self, value: str) -> int:
        raw = blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8, key=self._key)
        return int.from_bytes(raw.digest(), "little")

    def add(self, value: str) -> None:
        self._values.append(self.digest(value))
        self._sorted = None

    def seal(self) -> int | None:
        """Sort the digests; one that is held twice, or ``None``."""
        values = np.frombuffer(self._values, dtype=np.uint64).copy() if self._values else None
        self._sorted = np.sort(values) if values is not None else np.empty(0, np.uint64)
        same = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
        return int(self._sorted[same[0]]) if same.size else None

    def missing(self, values: list[str]) -> str | None:
        """The first of *values* not held (the set must be sealed)."""
        assert self._sorted is not None, "seal() before looking up"
        if not values:
            return None
        wanted = np.fromiter((self.digest(v) for v in values), np.uint64, len(values))
        at = np.searchsorted(self._sorted, wanted)
        found = at < self._sorted.size
        found[found] = self._sorted[at[found]] == wanted[found]
        misses = np.flatnonzero(~found)
        return values[int(misses[0])] if misses.size else None


class KnowledgeNode(NamedTuple):
    """What the knowledge base's tree rules read of a folder or a mental model."""

    id: str
    parent_id: str | None
    name: str
    is_folder: bool
    is_page: bool

    @classmethod
    def of_folder(cls, folder: KnowledgeFolder) -> KnowledgeNode:
        return cls(folder.id, folder.parent_id, folder.name, True, False)

    @classmethod
    def of_model(cls, row: MentalModelRow) -> KnowledgeNode:
        model = row.model
        return cls(model.id, model.parent_id, model.name, False, model.is_page)


@dataclass(slots=True)
class ArchiveCheck:
    """What :func:`check_archive` read: the manifest and the records per section."""

    manifest: Manifest
    bank: BankRecord | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(self.counts.values())


def check_embedder(manifest: Manifest, model: str, dim: int) -> None:
    """Refuse an archive whose vectors another embedder made (they are imported as they
    are)."""
    if (manifest.embedding_model, manifest.dim) != (model, dim):
        raise InvalidArchive(
            f"its vectors were made by {manifest.embedding_model!r} ({manifest.dim} "
            f"dimensions); this server embeds with {model!r} ({dim} dimensions), "
            "and heed imports vectors without embedding again"
        )


def check_archive_file(
    fd: ChildFd, limits: ArchiveLimits, model: str, dim: int, with_webhooks: bool
) -> tuple[ArchiveCheck, list[Webhook]]:
    """The whole check of the archive open as *fd* (handed to a child process: see
    :meth:`heed.transfer.service.BankTransfers.check_upload`), that this server's embedder
    made its vectors, and its webhooks (when *with_webhooks*) for the caller to check by
    the webhook service's rules. Blocking; raises :class:`InvalidArchive`."""
    with os.fdopen(fd.fd, "rb") as archive:
        archive.seek(0)
        with ArchiveReader(archive, limits) as reader:
            check_embedder(reader.manifest, model, dim)
            check = check_archive(reader)
            webhooks = list(reader.rows("webhooks")) if with_webhooks else []
    return check, webhooks


def check_archive(reader: ArchiveReader) -> ArchiveCheck:
    """Read every record of the archive once and check what spans records (see the module
    docstring); raises :class:`InvalidArchive` naming the first problem. Blocking; checks
    the token (every few records, and between batches of references)."""
    return _Check(reader).run()


class _Check:
    """One check's state: the digests of the ids read so far and the records counted."""

    def __init__(self, reader: ArchiveReader) -> None:
        self.reader = reader
        self.manifest = reader.manifest
        self.result = ArchiveCheck(self.manifest, reader.bank())
        self.records = 0

    def run(self) -> ArchiveCheck:
        self._small_sections()
        unit_ids = self._documents_and_units()
        self._observations(unit_ids)
        entity_ids = self._entities()
        self._references(
            "unit_entities",
            lambda row: ((row.unit_id, "memory"), (row.entity_id, "entity")),
            {"memory": unit_ids, "entity": entity_ids},
            "an entity row names {what} {value}",
        )
        self._references(
            "links",
            lambda row: ((row.from_id, "memory"), (row.to_id, "memory")),
            {"memory": unit_ids},
            "a link names {what} {value}, which is not here",
        )
        return self.result

    # -- reading -----------------------------------------------------------------------------

    def rows(self, section: str) -> Iterator[Any]:
        """*section*'s rows, counted against :attr:`ArchiveLimits.max_records`."""
        limit = self.reader.limits.max_records
        for row in self.reader.rows(section):
            self.records += 1
            if self.records > limit:
                raise InvalidArchive(
                    f"more than {limit} records in all; the limit is {limit} "
                    "(HEED_TRANSFER_MAX_RECORDS)"
                )
            yield row

    def counted(self, section: str, n: int) -> None:
        self.result.counts[section] = n
        if n != self.manifest.records(section):
            raise InvalidArchive(
                f"section {section!r} holds {n} records; {MANIFEST} declares "
                f"{self.manifest.records(section)}"
            )

    def duplicate(
        self,
        ids: IdDigests,
        sections: Iterable[str],
        key: Callable[[Any], Iterable[str]],
        what: str,
    ) -> None:
        """Refuse when *ids* holds a digest twice, naming the id (found by reading
        *sections* again: only on this refusal)."""
        twice = ids.seal()
        if twice is None:
            return
        for section in sections:
            for row in self.reader.rows(section):
                for value in key(row):
                    if ids.digest(value) == twice:
                        raise InvalidArchive(f"{what} {value[:100]!r} is in the archive twice")
        raise InvalidArchive(f"a {what} is in the archive twice")  # pragma: no cover

    # -- sections ----------------------------------------------------------------------------

    def _small_sections(self) -> None:
        """Directives, webhooks and the knowledge base: bounded by count as they are read."""
        for section, limit, what in (
            ("directives", MAX_DIRECTIVES, "directives; a bank holds at most"),
            ("webhooks", MAX_WEBHOOKS, "webhooks; an archive carries at most"),
        ):
            seen: set[str] = set()
            for n, row in enumerate(self.rows(section), 1):
                if n > limit:
                    raise InvalidArchive(f"more than {limit} {what} {limit}")
                _add_unique(row.id, seen, f"{section[:-1]} id")
            self.counted(section, len(seen))
        nodes: list[KnowledgeNode] = []
        for section, node in (
            ("knowledge_folders", KnowledgeNode.of_folder),
            ("mental_models", KnowledgeNode.of_model),
        ):
            n = 0
            for n, row in enumerate(self.rows(section), 1):
                if n > MAX_MENTAL_MODELS:
                    raise InvalidArchive(
                        f"more than {MAX_MENTAL_MODELS} {section.replace('_', ' ')}; "
                        "a bank holds at most that"
                    )
                nodes.append(node(row))
            self.counted(section, n)
        check_knowledge(nodes)

    def _documents_and_units(self) -> IdDigests:
        """Documents and their units, in step: a document's units follow it, in its order."""
        documents = self.rows("documents")
        unit_ids, document_ids, chunk_ids = IdDigests(), IdDigests(), IdDigests()
        current: DocumentRow | None = None
        own_chunks: set[str] = set()
        left = n_documents = n_units = 0
        for unit in self.rows("units"):
            assert isinstance(unit, UnitRow)
            where = f"unit {unit.id[:100]!r}"
            while left == 0:
                current = next(documents, None)
                if current is None:
                    raise InvalidArchive(f"{where} follows the last document's memories")
                n_documents += 1
                own_chunks = _add_document(current, document_ids, chunk_ids)
                left = current.unit_count
            assert current is not None
            if unit.document_id != current.document_id:
                raise InvalidArchive(
                    f"{where} names document {unit.document_id!r} where document "
                    f"{current.document_id!r}'s memories are ({left} left)"
                )
            if unit.chunk_id is not None and unit.chunk_id not in own_chunks:
                raise InvalidArchive(f"{where} names chunk {unit.chunk_id!r} of no document of its")
            unit_ids.add(unit.id)
            left -= 1
            n_units += 1
        if left:
            assert current is not None
            raise InvalidArchive(
                f"document {current.document_id!r} declares {current.unit_count} memories; "
                f"the units section ends {left} short"
            )
        for document in documents:
            n_documents += 1
            _add_document(document, document_ids, chunk_ids)
            if document.unit_count:
                raise InvalidArchive(
                    f"document {document.document_id!r} declares {document.unit_count} "
                    "memories; the units section has none left for it"
                )
        self.counted("documents", n_documents)
        self.counted("units", n_units)
        self.duplicate(document_ids, ["documents"], lambda d: [d.document_id], "document id")
        self.duplicate(chunk_ids, ["documents"], lambda d: [c.id for c in d.chunks], "chunk id")
        return unit_ids

    def _observations(self, unit_ids: IdDigests) -> None:
        n = 0
        for unit in self.rows("observations"):
            n += 1
            if unit.document_id is not None or unit.chunk_id is not None:
                raise InvalidArchive(f"observation {unit.id[:100]!r} names a document or chunk")
            unit_ids.add(unit.id)
        self.counted("observations", n)
        self.duplicate(unit_ids, ["units", "observations"], lambda u: [u.id], "memory id")

    def _entities(self) -> IdDigests:
        entity_ids, names = IdDigests(), IdDigests()
        n = 0
        for entity in self.rows("entities"):
            assert isinstance(entity, EntityRow)
            n += 1
            entity_ids.add(entity.id)
            key = canonical(entity.name)
            if not key:
                raise InvalidArchive(f"entity {entity.id[:100]!r} has no name to match by")
            names.add(key)
        self.counted("entities", n)
        self.duplicate(entity_ids, ["entities"], lambda e: [e.id], "entity id")
        self.duplicate(
            names,
            ["entities"],
            lambda e: [canonical(e.name)],
            "entity name (case and spaces aside)",
        )
        return entity_ids

    def _references(
        self,
        section: str,
        ends: Callable[[Any], Iterable[tuple[str, str]]],
        sets: dict[str, IdDigests],
        message: str,
    ) -> None:
        """Count *section* and check that every id its rows name (``ends``: value, kind)
        is held by the set of its kind, a batch at a time."""
        batches: dict[str, list[str]] = {what: [] for what in sets}
        n = 0

        def flush() -> None:
            raise_if_cancelled()
            for what, values in batches.items():
                missing = sets[what].missing(values)
                if missing is not None:
                    raise InvalidArchive(message.format(what=what, value=repr(missing[:100])))
                values.clear()

        for row in self.rows(section):
            n += 1
            for value, what in ends(row):
                batches[what].append(value)
            if n % _BATCH == 0:
                flush()
        flush()
        self.counted(section, n)


def check_knowledge(nodes: list[KnowledgeNode]) -> None:
    """The knowledge base's tree rules, as the store keeps them for writes through the
    API: ids unique across folders and models, a parent that is one of the folders, a page
    the only model with a parent, names unique among siblings, no cycle, at most
    ``MAX_NODE_DEPTH`` deep."""
    ids: set[str] = set()
    parents = {n.id: n.parent_id for n in nodes if n.is_folder}
    for node in nodes:
        _add_unique(node.id, ids, "knowledge-base node id")
    names: set[tuple[str | None, str]] = set()
    for node in nodes:
        if node.is_folder or node.is_page:
            if node.parent_id is not None and node.parent_id not in parents:
                raise InvalidArchive(
                    f"knowledge-base node {node.id[:100]!r} names folder "
                    f"{node.parent_id[:100]!r}, which is not here"
                )
            _add_unique_name((node.parent_id, node.name), names, node.id)
        elif node.parent_id is not None:
            raise InvalidArchive(f"mental model {node.id[:100]!r} has a parent but is no page")
    for folder_id, parent_id in parents.items():
        depth, at = 0, parent_id
        while at is not None:
            depth += 1
            if at == folder_id or depth >= MAX_NODE_DEPTH:
                raise InvalidArchive(
                    f"folder {folder_id[:100]!r} is in a cycle or nests deeper than "
                    f"{MAX_NODE_DEPTH}"
                )
            at = parents[at]


def _add_document(document: DocumentRow, ids: IdDigests, chunk_ids: IdDigests) -> set[str]:
    """Add *document*'s id and its chunks' ids; its own chunk ids (for its units)."""
    ids.add(document.document_id)
    own: set[str] = set()
    for chunk in document.chunks:
        chunk_ids.add(chunk.id)
        own.add(chunk.id)
    return own


def _add_unique_name(key: tuple[str | None, str], seen: set[Any], node_id: str) -> None:
    if key in seen:
        where = f"folder {key[0]!r}" if key[0] is not None else "the root"
        raise InvalidArchive(
            f"knowledge-base node {node_id[:100]!r}: a node named {key[1][:100]!r} is in "
            f"{where} already"
        )
    seen.add(key)


def _add_unique(value: str, seen: set[str], what: str) -> None:
    if value in seen:
        raise InvalidArchive(f"{what} {value[:100]!r} is in the archive twice")
    seen.add(value)
