"""The knowledge base (``/v1/default/banks/{bank_id}/knowledge-base``), hindsight-client
compatible.

- ``GET /tree``: folders and pages, nested (``tags``, ``tags_match``; page bodies left out);
- ``POST /folders`` (201), ``POST /pages`` (201: a page is a mental model with a parent; its
  first refresh starts, ``operation_id``);
- ``GET /pages/{page_id}``: a page as Markdown with front matter;
- ``GET /search?q=``: pages ranked by meaning and words (``limit`` 1-50, ``tags``);
- ``GET /export``: the whole base as Markdown files (index, pages, history logs);
- ``PATCH /nodes/{node_id}``: rename, move (``parent_id``; ``null``: the root), a page's
  options; ``DELETE /nodes/{node_id}``: a page, or a folder with everything under it.

``tag_groups`` is refused (400), as recall refuses it. The rules are
:mod:`heed.mental_models.knowledge`'s; this module translates.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from heed.api.deps import KnowledgeBaseDep, MemoryDep
from heed.api.input_rules import IdPath, QueryText
from heed.api.openapi import CONFLICT, NOT_FOUND, UPSTREAM
from heed.api.routes.mental_models import trigger_out
from heed.api.routing import HeedRoute
from heed.api.tag_query import TypedTagQueryDep
from heed.api.wire import memory as memory_wire
from heed.api.wire import mental_models as wire
from heed.mental_models.knowledge import Node, page_markdown, page_type, snippet
from heed.mental_models.values import MentalModel

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/knowledge-base",
    tags=["knowledge-base"],
    route_class=HeedRoute,
)

SearchLimit = Annotated[int, Query(ge=1, le=50)]


def _page_node(page: MentalModel, children: list[wire.KnowledgeNodeOut] | None) -> Any:
    return wire.KnowledgeNodeOut(
        id=page.id,
        kind="page",
        name=page.name,
        parent_id=page.parent_id,
        mental_model_id=page.id,
        description=page.source_query,
        tags=page.tags,
        timestamp=page.last_refreshed_at or page.updated_at,
        is_stale=page.is_stale,
        last_refresh_failed_at=page.last_refresh_failed_at,
        trigger=trigger_out(page),
        children=children,
    )


def node_out(node: Node) -> wire.KnowledgeNodeOut:
    children = [node_out(c) for c in node.children]
    if node.page is not None:
        return _page_node(node.page, children)  # type: ignore[no-any-return]
    return wire.KnowledgeNodeOut(
        id=node.id,
        kind="folder",
        name=node.name,
        parent_id=node.parent_id,
        managed=node.folder.managed if node.folder is not None else False,
        timestamp=node.folder.updated_at if node.folder is not None else None,
        children=children,
    )


@router.get("/tree")
async def get_knowledge_base_tree(
    bank_id: IdPath, engine: MemoryDep, knowledge: KnowledgeBaseDep, tag: TypedTagQueryDep
) -> wire.KnowledgeTreeResponse:
    """The knowledge base as a tree (folders first, then pages, by name)."""
    match = tag.match()
    bank = await engine.get_bank(bank_id)
    roots = await knowledge.tree(bank, tag.tags, match)
    return wire.KnowledgeTreeResponse(roots=[node_out(n) for n in roots])


@router.post("/folders", status_code=201, responses={**CONFLICT, **NOT_FOUND})
async def create_knowledge_folder(
    bank_id: IdPath, body: wire.CreateFolderRequest, engine: MemoryDep, knowledge: KnowledgeBaseDep
) -> wire.KnowledgeNodeOut:
    """A new folder (under ``parent_id``, else at the root)."""
    bank = await engine.get_bank(bank_id)
    folder = await knowledge.create_folder(bank, body.name, body.parent_id)
    return node_out(Node("folder", folder.id, folder.name, folder.parent_id, folder=folder))


@router.post("/pages", status_code=201, responses={**CONFLICT, **NOT_FOUND, **UPSTREAM})
async def create_knowledge_page(
    bank_id: IdPath, body: wire.CreatePageRequest, engine: MemoryDep, knowledge: KnowledgeBaseDep
) -> wire.CreateKnowledgePageResponse:
    """A new page; its content is written by the refresh it starts."""
    bank = await engine.get_bank(bank_id)
    page, run = await knowledge.create_page(
        bank, parent_id=body.parent_id, **wire.model_options(body)
    )
    return wire.CreateKnowledgePageResponse(
        page_id=page.id, mental_model_id=page.id, operation_id=run.id
    )


@router.get("/pages/{page_id}")
async def get_knowledge_page(
    bank_id: IdPath, page_id: IdPath, engine: MemoryDep, knowledge: KnowledgeBaseDep
) -> wire.KnowledgePageResponse:
    """A page rendered as Markdown (front matter, then its content)."""
    bank = await engine.get_bank(bank_id)
    page = await knowledge.page(bank, page_id)
    return wire.KnowledgePageResponse(
        id=page.id,
        name=page.name,
        type=page_type(page),
        description=page.source_query,
        tags=page.tags,
        timestamp=page.last_refreshed_at or page.updated_at,
        body=page.content,
        markdown=page_markdown(page),
    )


@router.get("/search")
async def search_knowledge_base(
    bank_id: IdPath,
    q: QueryText,
    engine: MemoryDep,
    knowledge: KnowledgeBaseDep,
    tag: TypedTagQueryDep,
    limit: SearchLimit = 10,
) -> wire.KnowledgeSearchResponse:
    """Pages ranked for ``q`` (score 1.0: first by meaning and by words)."""
    match = tag.match()
    bank = await engine.get_bank(bank_id)
    found = await knowledge.search(bank, q, limit, tag.tags, match)
    return wire.KnowledgeSearchResponse(
        results=[
            wire.KnowledgeSearchResult(
                id=page.id,
                name=page.name,
                mental_model_id=page.id,
                source_query=page.source_query,
                snippet=snippet(page),
                score=score,
                updated_at=page.last_refreshed_at or page.updated_at,
            )
            for page, score in found
        ],
        total=len(found),
    )


@router.get("/export")
async def export_knowledge_base(
    bank_id: IdPath, engine: MemoryDep, knowledge: KnowledgeBaseDep
) -> wire.KnowledgeBundleResponse:
    """The knowledge base as Markdown files."""
    bank = await engine.get_bank(bank_id)
    files = await knowledge.export(bank)
    return wire.KnowledgeBundleResponse(
        files=[wire.KnowledgeBundleFile(path=path, content=content) for path, content in files]
    )


@router.patch("/nodes/{node_id}", responses={**CONFLICT, **NOT_FOUND})
async def update_knowledge_node(
    bank_id: IdPath,
    node_id: IdPath,
    body: wire.UpdateNodeRequest,
    engine: MemoryDep,
    knowledge: KnowledgeBaseDep,
) -> wire.KnowledgeNodeOut:
    """Rename or move a node; a page's options too (a new question rebuilds the page)."""
    bank = await engine.get_bank(bank_id)
    return node_out(await knowledge.update_node(bank, node_id, wire.options_patch(body)))


@router.delete("/nodes/{node_id}")
async def delete_knowledge_node(
    bank_id: IdPath, node_id: IdPath, engine: MemoryDep, knowledge: KnowledgeBaseDep
) -> memory_wire.DeleteResponse:
    """Delete a page, or a folder with its whole subtree."""
    bank = await engine.get_bank(bank_id)
    pages = await knowledge.delete_node(bank, node_id)
    return memory_wire.deleted(
        f"knowledge-base node {node_id!r} deleted with {len(pages)} page(s)", len(pages)
    )
