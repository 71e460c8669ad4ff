"""Documents: list, get, retag, retain again, delete (``/v1/default/banks/{bank_id}/documents``).

A document id may contain ``/`` (a file path is a natural id): the routes take
the rest of the path as the id, so ``.../documents/dir/sub/doc`` (or its
``%2F``-escaped form) reads and deletes what ``document_id: "dir/sub/doc"`` wrote.

Any character, a line feed too. Starlette's ``path`` convertor is ``.*`` under ``^...$``:
an id holding a line feed (``%0A``) matched no route, so it was written and then never
readable or deletable, and ``doc%0A`` matched ``doc`` (``$`` also matches before a final line
feed). The ``document_path`` convertor is ``.*`` with DOTALL: the whole rest of the path.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.convertors import PathConvertor, register_url_convertor

from heed.api.deps import CurationDep, MemoryDep
from heed.api.input_rules import IdPath, QueryText
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.wire import memory as wire
from heed.memory.models import DocumentInfo, InvalidInput


class DocumentPathConvertor(PathConvertor):
    """The rest of the path, line feeds included (see the module docstring)."""

    regex = "(?s:.*)"


register_url_convertor("document_path", DocumentPathConvertor())


class DocumentOnlyPathConvertor(PathConvertor):
    """The rest of the path unless it ends in a document's sub-resource (``/chunks``,
    ``/history``, ``/reprocess``): a PATCH there is a method those routes do not take
    (405), not an edit of a document named ``.../chunks``, which the GET routes could
    never read either."""

    regex = "(?s:(?!.*/(?:chunks|history|reprocess)$).*)"


register_url_convertor("document_only_path", DocumentOnlyPathConvertor())

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/documents", tags=["documents"], route_class=HeedRoute
)


def _document_fields(d: DocumentInfo, bank_id: str) -> dict[str, Any]:
    """What a document's list item and its full answer both say of it, by wire name."""
    return {
        "id": d.document_id,
        "bank_id": bank_id,
        "content_hash": d.content_hash,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "memory_unit_count": d.unit_count,
        "document_metadata": d.metadata,
        "tags": d.tags,
    }


@router.get("")
async def list_documents(
    bank_id: IdPath,
    engine: MemoryDep,
    page: PageDep,
    q: QueryText | None = None,
) -> wire.ListDocumentsResponse:
    """The bank's documents, most recently written first."""
    docs, total = await engine.on_bank(
        bank_id,
        lambda bank: engine.list_documents(bank, q, page.limit, page.offset),
        found=lambda found: bool(found[0]),
    )
    items = [
        wire.DocumentListItem(**_document_fields(d, bank_id), text_length=d.text_length)
        for d in docs
    ]
    return page.answer(wire.ListDocumentsResponse, items, total)


@router.post("/{document_id:document_path}/reprocess")
async def reprocess_document(
    bank_id: IdPath, document_id: IdPath, engine: MemoryDep, curation: CurationDep
) -> wire.ReprocessDocumentResponse:
    """Retain the document's stored text again, in place, with the bank's settings as they
    are now: a ``retain`` operation (its id returned). See
    :meth:`heed.memory.curation.MemoryCuration.reprocess_document` for what is kept."""
    run, items = await engine.on_bank(
        bank_id, lambda bank: curation.reprocess_document(bank, document_id)
    )
    return wire.ReprocessDocumentResponse(success=True, operation_id=run.id, items_count=items)


@router.patch("/{document_id:document_only_path}")
async def update_document(
    bank_id: IdPath,
    document_id: IdPath,
    body: wire.UpdateDocumentRequest,
    engine: MemoryDep,
    curation: CurationDep,
) -> wire.UpdateDocumentResponse:
    """Give the document and its memories a new set of tags (``[]`` clears them); the
    observations citing its memories go and they are consolidated again."""
    if body.observation_scopes is not None:
        raise InvalidInput(
            "observation_scopes: heed keeps no per-document observation scoping; set the "
            "bank's default_observation_scopes (PATCH .../config) instead"
        )
    if body.tags is None:
        raise InvalidInput("give tags: the document's complete new set of tags ([] clears them)")
    tags = body.tags
    await engine.on_bank(bank_id, lambda bank: curation.retag_document(bank, document_id, tags))
    return wire.UpdateDocumentResponse(success=True)


@router.get("/{document_id:document_path}")
async def get_document(
    bank_id: IdPath, document_id: IdPath, engine: MemoryDep
) -> wire.DocumentResponse:
    """One document with its text."""
    d = await engine.on_bank(bank_id, lambda bank: engine.get_document(bank, document_id))
    return wire.DocumentResponse(
        **_document_fields(d, bank_id),
        original_text=d.original_text,
        nodes_by_fact_type=d.units_by_type,
    )


@router.delete("/{document_id:document_path}")
async def delete_document(
    bank_id: IdPath, document_id: IdPath, engine: MemoryDep
) -> wire.DeleteDocumentResponse:
    """Delete a document and its units (one transaction)."""
    deleted = await engine.on_bank(bank_id, lambda bank: engine.delete_document(bank, document_id))
    return wire.DeleteDocumentResponse(
        success=True,
        message=f"document {document_id!r} deleted",
        document_id=document_id,
        memory_units_deleted=deleted,
    )
