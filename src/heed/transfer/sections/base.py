"""What an archive section is, and what it is given to do its part of a transfer.

A section (docs/bank-archive.md, "Sections") is one module of :mod:`heed.transfer.sections`
exporting a :class:`Section`: its name and the format version that added it, the record
one line holds (:meth:`Section.encode` a row into it, :meth:`Section.decode` it back,
checked), and its part of each transfer:

- :meth:`Section.read`: an export's pages of rows from the bank (:class:`ExportContext`);
- :meth:`Section.write`: an import's write of the archive's rows into the staging bank
  (:class:`ImportContext`), returning the rows written by name;
- :meth:`Section.check`: the check of an upload (:class:`Checker`: what spans records:
  unique ids, references, counts), run in the registry's order, so a section may use what
  an earlier one gathered (the memories' ids, the entities', the knowledge base's tree).

Which sections a transfer carries is the section's :data:`Group`'s (:func:`exported`,
:func:`imported`): the bank's profile, its settings (``config``), its knowledge base
(``knowledge``) or its memories and what backs them (``data``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, Protocol

from heed.memory.models import Bank, InvalidInput
from heed.memory.store import MemoryStore
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import (
    MAX_MENTAL_MODELS,
    MAX_NODE_DEPTH,
    KnowledgeFolder,
    MentalModelRow,
)
from heed.runtime import raise_if_cancelled
from heed.transfer.ids import IdDigests, NewIds
from heed.transfer.records import MANIFEST, InvalidArchive
from heed.transfer.rows import BankReader, BankSelection
from heed.transfer.store import TransferStore
from heed.webhooks.service import Webhooks

if TYPE_CHECKING:
    from heed.transfer.archive import ArchiveReader, Manifest
    from heed.transfer.sections.bank import BankRecord

__all__ = [
    "IMPORT_BATCH",
    "Checker",
    "ExportContext",
    "Flags",
    "Group",
    "ImportContext",
    "KnowledgeNode",
    "Progress",
    "Scope",
    "Section",
    "TransferStores",
    "check_knowledge",
    "exported",
    "imported",
    "pages",
]

Scope = Literal["bank", "documents"]
#: What part of a bank a section holds: its profile (``bank``), its settings, rules and
#: webhooks (``config``), its knowledge base (``knowledge``), its memories and what backs
#: them (``data``).
Group = Literal["bank", "config", "knowledge", "data"]
#: Memories written per batch on import (a cancel waits for at most one: a few ms).
IMPORT_BATCH: Final = 32
#: References looked up at once in the sorted digests.
_BATCH: Final = 4096


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


def exported(group: Group, scope: Scope, flags: Flags) -> bool:
    """Whether an export of *scope* with *flags* writes the sections of *group*: a
    documents archive holds no ``bank`` or ``config`` section."""
    if group == "bank":
        return scope == "bank"
    if group == "config":
        return scope == "bank" and flags.include_bank_config
    if group == "knowledge":
        return flags.include_bank_config if scope == "bank" else flags.include_knowledge_base
    return flags.include_data


def imported(group: Group, flags: Flags) -> bool:
    """Whether an import with *flags* writes the sections of *group* (the ``bank`` record
    names the bank whatever the flags; a section the archive lacks is empty)."""
    if group == "bank":
        return True
    if group in ("config", "knowledge"):
        return flags.include_bank_config
    return flags.include_data


class Progress(Protocol):
    """Where a transfer reports how far it is (called from its worker thread)."""

    def start(self, stage: str, total: int) -> None: ...

    def add(self, n: int) -> None: ...


def pages(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """*rows* in lists of at most *size*."""
    iterator = iter(rows)
    while page := list(itertools.islice(iterator, size)):
        yield page


@dataclass(frozen=True, slots=True)
class TransferStores:
    """Where a transfer reads and writes a bank: its memory store (profile, directives),
    its rows (:class:`~heed.transfer.store.TransferStore`), its mental models and
    knowledge base (*knowledge*) and its webhooks (*webhooks*). A part that is ``None``
    is neither exported nor imported."""

    memory: MemoryStore
    rows: TransferStore
    knowledge: MentalModelStore | None = None
    webhooks: Webhooks | None = None


@dataclass(slots=True)
class ExportContext:
    """What an export gives each section's :meth:`Section.read`: the bank (its
    *selection*), the flags, where to read, the page size and the progress. The data
    sections share one snapshot of the bank (:meth:`snapshot`), open until the export
    ends."""

    bank: Bank
    selection: BankSelection
    flags: Flags
    scope: Scope
    stores: TransferStores
    batch: int
    progress: Progress
    exits: ExitStack = field(default_factory=ExitStack)
    _snapshot: BankReader | None = None

    def snapshot(self) -> BankReader:
        """The bank's rows from one consistent snapshot, opened on first use (the export's
        progress then starts, over its memories)."""
        if self._snapshot is None:
            self._snapshot = self.exits.enter_context(
                self.stores.rows.read_bank(self.bank.ref, self.selection)
            )
            self.progress.start("export", self._snapshot.count_units())
        return self._snapshot


@dataclass(slots=True)
class ImportContext:
    """What an import gives each section's :meth:`Section.write`: the archive, the staging
    bank written into and the *target* bank it is published as (whose profile the
    ``bank`` section sets), the archive's ``bank`` record (``None`` in a documents
    archive), the new ids, where to write, the batch size and the progress."""

    reader: ArchiveReader
    record: BankRecord | None
    staging: Bank
    target: Bank
    flags: Flags
    ids: NewIds
    stores: TransferStores
    batch: int
    progress: Progress

    def knowledge_store(self, section: str) -> MentalModelStore | None:
        """The store the knowledge base's *section* is written into; ``None`` when this
        server has none and the archive holds none of *section* (when it holds some,
        refused)."""
        store = self.stores.knowledge
        if store is None and self.reader.manifest.records(section):
            raise InvalidInput("this server cannot import mental models")
        return store


@dataclass(frozen=True, slots=True)
class Section:
    """An archive section (see the module docstring). *single*: the section is one JSON
    object in ``<name>.json`` (the ``bank``), not lines in numbered shards."""

    name: str
    since: int
    group: Group
    encode: Callable[[Any], dict[str, Any]]
    decode: Callable[[dict[str, Any], int, str], Any]
    read: Callable[[ExportContext], Iterable[list[Any]]]
    write: Callable[[ImportContext], dict[str, int]]
    check: Callable[[Checker], None]
    single: bool = False


# -- checking -------------------------------------------------------------------------------


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


class Checker:
    """One check of an archive (:func:`heed.transfer.check.check_archive`): the records
    counted so far, and what sections gather for later ones: the memories' ids
    (*memories*), the entities' (*entities*), the knowledge base's tree (*knowledge*).
    Every refusal is an :class:`InvalidArchive`."""

    def __init__(self, reader: ArchiveReader) -> None:
        self.reader = reader
        self.manifest: Manifest = reader.manifest
        self.counts: dict[str, int] = {}
        self.records = 0
        self.memories = IdDigests()
        self.entities = IdDigests()
        self.knowledge: list[KnowledgeNode] = []

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
        """*section* held *n* records: the number its manifest entry must declare."""
        self.counts[section] = n
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

    def unique(self, section: str, limit: int, what: str) -> None:
        """Count a small *section* (at most *limit* records, else refused with *what*)
        whose ids must be unique."""
        seen: set[str] = set()
        for n, row in enumerate(self.rows(section), 1):
            if n > limit:
                raise InvalidArchive(f"more than {limit} {what} {limit}")
            add_unique(row.id, seen, f"{section[:-1]} id")
        self.counted(section, len(seen))

    def knowledge_nodes(
        self, section: str, node: Callable[[Any], KnowledgeNode], what: str
    ) -> None:
        """Count *section*, a part of the knowledge base (at most ``MAX_MENTAL_MODELS``
        records, else refused naming *what*), gathering its rows' nodes in
        :attr:`knowledge` for :func:`check_knowledge`."""
        n = 0
        for n, row in enumerate(self.rows(section), 1):
            if n > MAX_MENTAL_MODELS:
                raise InvalidArchive(
                    f"more than {MAX_MENTAL_MODELS} {what}; a bank holds at most that"
                )
            self.knowledge.append(node(row))
        self.counted(section, n)

    def references(
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
        add_unique(node.id, ids, "knowledge-base node id")
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


def _add_unique_name(key: tuple[str | None, str], seen: set[Any], node_id: str) -> None:
    if key in seen:
        where = f"folder {key[0]!r}" if key[0] is not None else "the root"
        raise InvalidArchive(
            f"knowledge-base node {node_id[:100]!r}: a node named {key[1][:100]!r} is in "
            f"{where} already"
        )
    seen.add(key)


def add_unique(value: str, seen: set[str], what: str) -> None:
    """Add *value* to *seen*, refusing it when it is there (*what* names it)."""
    if value in seen:
        raise InvalidArchive(f"{what} {value[:100]!r} is in the archive twice")
    seen.add(value)
