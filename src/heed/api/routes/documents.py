"""Documents: list, get, delete (``/v1/default/banks/{bank_id}/documents``)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from heed.api.memory_http import MemoryRoute, engine_of
from heed.api.wire import memory as wire

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/documents", tags=["documents"], route_class=MemoryRoute
)


@router.get("")
async def list_documents(
    bank_id: str,
    request: Request,
    q: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0),
) -> wire.ListDocumentsResponse:
    """The bank's documents, most recently written first."""
    engine = engine_of(request)
    bank = await engine.get_bank(bank_id)
    docs, total = await engine.list_documents(bank, q, limit, offset)
    return wire.ListDocumentsResponse(
        items=[
            wire.DocumentListItem(
                id=d.document_id,
                bank_id=bank_id,
                content_hash=d.content_hash,
                created_at=d.created_at,
                updated_at=d.updated_at,
                text_length=d.text_length,
                memory_unit_count=d.unit_count,
                document_metadata=d.metadata,
                tags=d.tags,
            )
            for d in docs
        ],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/{document_id}")
async def get_document(bank_id: str, document_id: str, request: Request) -> wire.DocumentResponse:
    """One document with its text."""
    engine = engine_of(request)
    bank = await engine.get_bank(bank_id)
    d = await engine.get_document(bank, document_id)
    return wire.DocumentResponse(
        id=d.document_id,
        bank_id=bank_id,
        original_text=d.original_text,
        content_hash=d.content_hash,
        created_at=d.created_at,
        updated_at=d.updated_at,
        memory_unit_count=d.unit_count,
        nodes_by_fact_type=d.units_by_type,
        tags=d.tags,
        document_metadata=d.metadata,
    )


@router.delete("/{document_id}")
async def delete_document(
    bank_id: str, document_id: str, request: Request
) -> wire.DeleteDocumentResponse:
    """Delete a document and its units (one transaction)."""
    engine = engine_of(request)
    bank = await engine.get_bank(bank_id)
    deleted = await engine.delete_document(bank, document_id)
    return wire.DeleteDocumentResponse(
        success=True,
        message=f"document {document_id!r} deleted",
        document_id=document_id,
        memory_units_deleted=deleted,
    )
