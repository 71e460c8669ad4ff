"""Section ``knowledge_folders`` (since version 2): the knowledge base's folders, with the
bank's settings (or a documents export's ``include_knowledge_base``). Their ids are the
bank's own and are kept; the tree is checked with the mental models
(:mod:`heed.transfer.sections.mental_models`)."""

from __future__ import annotations

from collections.abc import Iterator

from heed.mental_models.values import KnowledgeFolder
from heed.transfer.records import (
    Id,
    Name,
    Record,
    codec,
)
from heed.transfer.sections.base import (
    Checker,
    ExportContext,
    ImportContext,
    KnowledgeNode,
    Section,
)

__all__ = ["SECTION", "FolderRecord"]


class FolderRecord(Record):
    """A knowledge-base folder."""

    id: Id
    name: Name
    parent_id: Id | None
    managed: bool
    created_at: str
    updated_at: str


encode, decode = codec(FolderRecord, KnowledgeFolder, bank_ref="")


def read(ctx: ExportContext) -> Iterator[list[KnowledgeFolder]]:
    if ctx.stores.knowledge is not None:
        yield ctx.stores.knowledge.knowledge_folders(ctx.bank.ref)


def write(ctx: ImportContext) -> dict[str, int]:
    store = ctx.knowledge_store("knowledge_folders")
    if store is None:
        return {}
    folders: list[KnowledgeFolder] = list(ctx.reader.rows("knowledge_folders"))
    for folder in folders:
        folder.bank_ref = ctx.staging.ref
    return {"knowledge_folders": store.write_knowledge_rows(ctx.staging.ref, folders, [])}


def check(checker: Checker) -> None:
    checker.knowledge_nodes("knowledge_folders", KnowledgeNode.of_folder, "knowledge folders")


SECTION = Section("knowledge_folders", 2, "knowledge", encode, decode, read, write, check)
