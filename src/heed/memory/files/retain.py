"""File retain: uploaded files become documents, synchronously or as retain operations.

:meth:`FileRetain.retain` is what ``POST .../files/retain`` does, in this order:

1. **Check** every file before reading any: the count, each file's size and type
   (:mod:`heed.memory.files`), its document id (the ``document_id`` its metadata gives, else
   the file's name; two files may not be one document), and the metadata's length. A bad file
   refuses the whole request: nothing is written.
2. **Parse** every file, one at a time, in a child process of its own
   (:func:`heed.memory.files.parse.parse_file`: CPU time, memory and wall-clock time
   bounded), under a ``parse`` lane slot and as work on the bank
   (:meth:`MemoryEngine.track`): a client that leaves (or a bank delete) kills the child at
   once, and the slot is released only once it is gone. Any file that cannot be read
   refuses the request, still before anything is written. Parsing holds no ``retain``
   slot: however long a hostile file takes to parse, another tenant's retain never waits
   for it.
3. **Retain**: each file is one document (its text cut into items of at most the engine's
   item size, one document id, ``replace``). Synchronously (the default) through
   :meth:`MemoryEngine.retain` under the request's token, so a client that leaves stops the
   embedding too and no document is half-written; with ``async`` each file is submitted as
   a ``retain`` operation (:class:`heed.memory.retain.operations.RetainOperations`), whose ids are
   returned. Parsing is always done in the request, so a bad file is a 400 in either mode.

Each document's metadata holds the given metadata plus ``file_name`` and ``file_format``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import PurePosixPath
from typing import Final

from heed.memory.engine import MemoryEngine
from heed.memory.files.parse import extract_text, parse_file
from heed.memory.files.rules import (
    FileLimits,
    FileRefused,
    UploadedFile,
    check_count,
    check_size,
    detect_format,
    file_label,
    split_text,
)
from heed.memory.models import Bank, RetainItem
from heed.memory.retain.operations import RetainOperations
from heed.runtime import Lane

__all__ = ["MAX_DOCUMENT_ID_CHARS", "FileMeta", "FileRetain", "FileRetainResult"]

#: The longest document id a file's name may give (as any id heed takes).
MAX_DOCUMENT_ID_CHARS: Final = 512


@dataclass(frozen=True, slots=True)
class FileMeta:
    """What a client says of one file (an entry of ``files_metadata``)."""

    context: str | None = None
    document_id: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FileRetainResult:
    """What a file retain did: the documents (one per file, in order), and either the
    units written (sync) or the operation ids (async, one per file)."""

    document_ids: list[str]
    operation_ids: list[str]
    units: int
    items: int
    async_: bool


@dataclass(eq=False)
class FileRetain:
    """File retain over the memory engine and its retain operations (module docstring)."""

    engine: MemoryEngine
    operations: RetainOperations
    #: Where parses wait and run (a lane of their own: step 2 of the module docstring).
    parse_lane: Lane
    limits: FileLimits
    #: What parses a file in the child (a module-level function; tests put a slow one).
    parser: Callable[[int, UploadedFile, FileLimits], tuple[str, str]] = field(
        init=False, default_factory=lambda: extract_text
    )
    #: Told each parsing child once it started (tests watch it being killed).
    on_parse_start: Callable[[BaseProcess], None] | None = field(init=False, default=None)

    async def retain(
        self,
        bank: Bank,
        files: list[UploadedFile],
        metas: list[FileMeta] | None,
        *,
        async_: bool = False,
    ) -> FileRetainResult:
        """Parse *files* and retain each as a document of *bank* (see the module docstring).

        *metas*, when given, has one entry per file. Raises ``FileRefused`` /
        ``FileTooLarge`` / ``InvalidInput`` (nothing written), ``NotFound``,
        ``OperationCancelled``.
        """
        check_count(len(files), self.limits)
        if metas is None or not metas:
            metas = [FileMeta() for _ in files]
        if len(metas) != len(files):
            raise FileRefused(
                f"files_metadata has {len(metas)} entries for {len(files)} files: "
                "give one per file, in order, or none"
            )
        document_ids = self._document_ids(files, metas)
        for index, file in enumerate(files):  # cheap checks first: no parsing for a bad list
            check_size(index, file, self.limits)
            detect_format(index, file)
        async with self.engine.track(bank), self.parse_lane.slot():
            parsed = [
                await parse_file(
                    index, file, self.limits, parser=self.parser, on_start=self.on_parse_start
                )
                for index, file in enumerate(files)
            ]
        per_file = [
            self._items(file, fmt, text, meta, document_id)
            for file, (fmt, text), meta, document_id in zip(
                files, parsed, metas, document_ids, strict=True
            )
        ]
        for items in per_file:
            self.engine.validate_items(items)
        count = sum(len(items) for items in per_file)
        if async_:
            runs = [await self.operations.submit(bank, items, []) for items in per_file]
            return FileRetainResult(document_ids, [r.id for r in runs], 0, count, True)
        summary = await self.engine.retain(bank, [i for items in per_file for i in items], [])
        return FileRetainResult(document_ids, [], summary.units, count, False)

    @staticmethod
    def _document_ids(files: list[UploadedFile], metas: list[FileMeta]) -> list[str]:
        ids: list[str] = []
        seen: dict[str, int] = {}
        for index, (file, meta) in enumerate(zip(files, metas, strict=True)):
            document_id = meta.document_id or _base_name(file.name)
            if not document_id:
                raise FileRefused(
                    f"{file_label(index, file)} has no file name: give its document_id "
                    "in files_metadata"
                )
            if len(document_id) > MAX_DOCUMENT_ID_CHARS:
                raise FileRefused(
                    f"{file_label(index, file)}: its document id has {len(document_id)} "
                    f"characters; the limit is {MAX_DOCUMENT_ID_CHARS}"
                )
            if document_id in seen:
                raise FileRefused(
                    f"{file_label(index, file)} and "
                    f"{file_label(seen[document_id], files[seen[document_id]])} would both be "
                    f"document {document_id!r}: give each its own document_id"
                )
            seen[document_id] = index
            ids.append(document_id)
        return ids

    def _items(
        self, file: UploadedFile, fmt: str, text: str, meta: FileMeta, document_id: str
    ) -> list[RetainItem]:
        metadata: dict[str, str] = {
            **meta.metadata,
            "file_name": _base_name(file.name) or document_id,
            "file_format": fmt,
        }
        return [
            RetainItem(
                content=piece,
                context=meta.context,
                metadata=metadata,
                document_id=document_id,
                tags=list(meta.tags),
                update_mode="replace",
            )
            for piece in split_text(text, self.engine.max_item_chars)
        ]


def _base_name(name: str) -> str:
    """The last part of a file name sent with a path (``C:\\a\\b.txt`` or ``a/b.txt``)."""
    return PurePosixPath(name.replace("\\", "/")).name if name else ""
