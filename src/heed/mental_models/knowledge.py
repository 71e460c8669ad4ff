"""The knowledge base: a tree of folders whose pages are mental models.

A **page** is a mental model with ``is_page`` (:mod:`heed.mental_models.service` creates
it, with its first refresh); a **folder** groups folders and pages. Names are unique among
siblings; a node moves by its ``parent_id`` (``None``: the root), never under itself.
Deleting a folder deletes its whole subtree, the pages' refreshes cancelled first.

Reads: the **tree** (pages filtered by tags, recall's rule; when a filter is given, only
the folders on the way to a page it keeps), a **page** rendered as Markdown with YAML front
matter, a **search** over the pages (meaning and words, fused by rank:
:func:`heed.mental_models.lookup.rank_models`), and an **export**: ``index.md``, one file
per page under its folders' path, and one history log per page, every path made of
lowercase letters, digits and hyphens only (no path from a client reaches it).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, InvalidInput, NotFound
from heed.mental_models.service import MentalModels
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import (
    MAX_MENTAL_MODELS,
    KnowledgeFolder,
    MentalModel,
    tags_pass,
)
from heed.runs.model import Run
from heed.runtime import run_in_thread

__all__ = ["NO_CONTENT", "KnowledgeBase", "Node", "page_markdown", "page_type"]

#: What a page without content shows as its body (the stored body stays empty).
NO_CONTENT: Final = "No content yet."
SNIPPET_CHARS: Final = 240
_TYPE_TAG: Final = "type:"
_SLUG: Final = re.compile(r"[^a-z0-9]+")


@dataclass(slots=True)
class Node:
    """A node of the tree: a folder, or a page and its model."""

    kind: str
    id: str
    name: str
    parent_id: str | None
    folder: KnowledgeFolder | None = None
    page: MentalModel | None = None
    children: list[Node] = field(default_factory=list)


def page_type(model: MentalModel) -> str:
    """A page's type: from its first ``type:<x>`` tag, else ``knowledge-page``."""
    for tag in model.tags:
        if tag.startswith(_TYPE_TAG) and len(tag) > len(_TYPE_TAG):
            return tag[len(_TYPE_TAG) :]
    return "knowledge-page"


def page_markdown(model: MentalModel, *, notice: bool = True) -> str:
    """The page as a Markdown document: YAML front matter (JSON-quoted values, which YAML
    reads as they are), then its content, or :data:`NO_CONTENT` (with *notice*)."""
    front = {
        "id": model.id,
        "name": model.name,
        "type": page_type(model),
        "source_query": model.source_query,
        "tags": model.tags,
        "updated": model.last_refreshed_at or model.updated_at,
    }
    lines = ["---", *(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in front.items()), "---"]
    body = model.content or (NO_CONTENT if notice else "")
    return "\n".join(lines) + "\n\n" + body + ("\n" if body else "")


def snippet(model: MentalModel) -> str:
    """A page's opening text (or :data:`NO_CONTENT`)."""
    text = " ".join(model.content.split())
    if not text:
        return NO_CONTENT
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def _slug(name: str, taken: set[str]) -> str:
    base = _SLUG.sub("-", name.lower()).strip("-")[:60] or "page"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


@dataclass(eq=False)
class KnowledgeBase:
    """See the module docstring."""

    engine: MemoryEngine
    store: MentalModelStore
    models: MentalModels

    async def _all(self, bank: Bank) -> tuple[list[KnowledgeFolder], list[MentalModel]]:
        folders = await run_in_thread(self.store.knowledge_folders, bank.ref)
        pages = [m for m in await run_in_thread(self.store.mental_models, bank.ref) if m.is_page]
        return folders, pages

    # -- reads ---------------------------------------------------------------------------

    async def tree(
        self, bank: Bank, tags: list[str] | None = None, tags_match: str = "any"
    ) -> list[Node]:
        """The roots of the tree, children ordered folders first, then by name."""
        folders, pages = await self._all(bank)
        filtered = bool(tags) or tags_match == "exact"
        nodes: dict[str, Node] = {
            f.id: Node("folder", f.id, f.name, f.parent_id, folder=f) for f in folders
        }
        keep: set[str] = set() if filtered else set(nodes)
        roots: list[Node] = []
        for page in pages:
            if not tags_pass(page.tags, tags, tags_match):
                continue
            node = Node("page", page.id, page.name, page.parent_id, page=page)
            parent = nodes.get(page.parent_id) if page.parent_id else None
            (parent.children if parent is not None else roots).append(node)
            up, hops = page.parent_id, 0
            while up is not None and up in nodes and hops <= len(nodes):
                keep.add(up)
                up, hops = nodes[up].parent_id, hops + 1
        for node in nodes.values():
            if node.id not in keep:
                continue
            parent = nodes.get(node.parent_id) if node.parent_id else None
            (parent.children if parent is not None else roots).append(node)
        for node in nodes.values():
            node.children.sort(key=lambda n: (n.kind != "folder", n.name, n.id))
        return sorted(roots, key=lambda n: (n.kind != "folder", n.name, n.id))

    async def page(self, bank: Bank, page_id: str) -> MentalModel:
        """The page *page_id*; :class:`NotFound` naming it (a mental model that is no page
        is not one)."""
        model = await run_in_thread(self.store.get_mental_model, bank.ref, page_id)
        if model is None or not model.is_page:
            raise NotFound(f"knowledge page {page_id!r} not found")
        return model

    async def search(
        self,
        bank: Bank,
        query: str,
        limit: int = 10,
        tags: list[str] | None = None,
        tags_match: str = "any",
    ) -> list[tuple[MentalModel, float]]:
        """The pages *query* finds, best first, with their fused score (0..1)."""
        if not query.strip():
            raise InvalidInput("q is empty")
        if not 1 <= limit <= 50:
            raise InvalidInput("limit must be between 1 and 50")
        models = await run_in_thread(self.store.mental_models, bank.ref, True)
        pages = [m for m in models if m.is_page and tags_pass(m.tags, tags, tags_match)]
        found = await self.models.refreshes.lookup.search(query, pages)
        return found[:limit]

    async def export(self, bank: Bank) -> list[tuple[str, str]]:
        """The knowledge base as ``(path, content)`` Markdown files (see the module
        docstring)."""
        folders, pages = await self._all(bank)
        by_id = {f.id: f for f in folders}
        folder_slugs: dict[str, str] = {}
        taken_per_parent: dict[str | None, set[str]] = {}
        for folder in folders:
            folder_slugs[folder.id] = _slug(
                folder.name, taken_per_parent.setdefault(folder.parent_id, set())
            )

        def path_of(folder_id: str | None) -> list[str]:
            parts: list[str] = []
            while folder_id is not None and folder_id in by_id and len(parts) <= len(by_id):
                parts.append(folder_slugs[folder_id])
                folder_id = by_id[folder_id].parent_id
            return parts[::-1]

        files: list[tuple[str, str]] = []
        index = [f"# Knowledge base of {bank.name or bank.bank_id}", ""]
        for page in sorted(pages, key=lambda p: (path_of(p.parent_id), p.name)):
            slug = _slug(page.name, taken_per_parent.setdefault(page.parent_id, set()))
            path = "/".join(["pages", *path_of(page.parent_id), f"{slug}.md"])
            files.append((path, page_markdown(page, notice=False)))
            history = await run_in_thread(self.store.mental_model_history, bank.ref, page.id)
            log_path = "/".join(["log", *path_of(page.parent_id), f"{slug}.md"])
            log = [f"# History of {page.name}", ""]
            for entry in history:
                log += [f"## {entry.changed_at} ({entry.reason})", "", entry.previous_content, ""]
            files.append((log_path, "\n".join(log)))
            index.append(f"- [{page.name}]({path})")
        return [("index.md", "\n".join(index) + "\n"), *files]

    # -- writes --------------------------------------------------------------------------

    async def create_folder(
        self, bank: Bank, name: str, parent_id: str | None = None
    ) -> KnowledgeFolder:
        """A new folder under *parent_id* (the root when ``None``)."""
        if not name.strip():
            raise InvalidInput("name is empty")
        folder = KnowledgeFolder(
            bank_ref=bank.ref, id=str(uuid.uuid4()), name=name.strip(), parent_id=parent_id
        )
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            return await run_in_thread(
                self.store.create_knowledge_folder, folder, MAX_MENTAL_MODELS
            )

    async def create_page(
        self,
        bank: Bank,
        *,
        name: str,
        source_query: str,
        parent_id: str | None = None,
        tags: list[str] | None = None,
        max_tokens: int | None = None,
        trigger: dict[str, Any] | None = None,
    ) -> tuple[MentalModel, Run]:
        """A new page (a mental model) and its first refresh."""
        return await self.models.create(
            bank,
            name=name,
            source_query=source_query,
            tags=tags,
            max_tokens=max_tokens,
            trigger=trigger,
            parent_id=parent_id,
            is_page=True,
        )

    async def update_node(self, bank: Bank, node_id: str, patch: dict[str, Any]) -> Node:
        """Rename or move a node (``parent_id`` in *patch*, ``None``: to the root), and for
        a page change its model's options; a new ``source_query`` starts a refresh."""
        page = await run_in_thread(self.store.get_mental_model, bank.ref, node_id)
        if page is not None and page.is_page:
            model_fields = {k: patch[k] for k in patch if k != "parent_id"}
            if model_fields:
                page = await self.models.update(bank, node_id, model_fields)
            if "parent_id" in patch:
                async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
                    moved = await run_in_thread(
                        self.store.update_mental_model,
                        bank.ref,
                        node_id,
                        {"parent_id": patch["parent_id"]},
                    )
                if moved is None:
                    raise NotFound(f"knowledge-base node {node_id!r} not found")
                page = moved
            if patch.get("source_query") is not None:
                await self.models.refreshes.submit(bank, page, "updated", enforce_interval=False)
            return Node("page", page.id, page.name, page.parent_id, page=page)
        page_only = [k for k in ("source_query", "tags", "max_tokens", "trigger") if k in patch]
        folders = await run_in_thread(self.store.knowledge_folders, bank.ref)
        if node_id not in {f.id for f in folders}:
            raise NotFound(f"knowledge-base node {node_id!r} not found")
        if page_only:
            raise InvalidInput(
                f"{', '.join(page_only)}: only a page has these; {node_id!r} is a folder"
            )
        changes: dict[str, Any] = {k: patch[k] for k in ("name", "parent_id") if k in patch}
        if "name" in changes:
            if not str(changes["name"]).strip():
                raise InvalidInput("name is empty")
            changes["name"] = str(changes["name"]).strip()
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            folder = await run_in_thread(
                self.store.update_knowledge_folder, bank.ref, node_id, changes
            )
        if folder is None:
            raise NotFound(f"knowledge-base node {node_id!r} not found")
        return Node("folder", folder.id, folder.name, folder.parent_id, folder=folder)

    async def delete_node(self, bank: Bank, node_id: str) -> list[str]:
        """Delete a page, or a folder with its subtree: the ids of the pages deleted (their
        refreshes cancelled and stopped first)."""
        folders, pages = await self._all(bank)
        ids = {f.id for f in folders} | {p.id for p in pages}
        if node_id not in ids:
            raise NotFound(f"knowledge-base node {node_id!r} not found")
        subtree = {node_id}
        for _ in range(len(folders) + 1):
            subtree |= {f.id for f in folders if f.parent_id in subtree}
        doomed = [p.id for p in pages if p.id in subtree or p.parent_id in subtree]
        await self.models.refreshes.cancel_model_runs(bank, doomed)
        async with self.engine.track(bank), self.engine.bank_gone_is_not_found(bank):
            deleted = await run_in_thread(self.store.delete_knowledge_node, bank.ref, node_id)
        if deleted is None:
            raise NotFound(f"knowledge-base node {node_id!r} not found")
        return deleted
