"""Chunks: the raw text of a retained item as heed split and stored it.

- ``GET /v1/default/banks/{bank_id}/documents/{document_id}/chunks``: a document's chunks
  by index, paged (a 404 naming an unknown document);
- ``GET /v1/default/chunks/{chunk_id}``: one chunk of any of the caller's banks (chunk ids
  are unique; another tenant's chunk is a 404 like an unknown one).

A chunk's ``created_at`` is its document's; heed keeps no attachments, so
``attachments`` is ``[]``. A document id may hold ``/`` (:mod:`heed.api.routes.documents`'s
path convertor): this router is included before the documents', so ``.../chunks`` at the
end of such a path names this route.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

import heed.api.routes.documents  # noqa: F401  (registers the document_path convertor)
from heed.api.deps import ViewsDep
from heed.api.input_rules import IdPath, Offset
from heed.api.routing import HeedRoute
from heed.api.wire import views as wire

router = APIRouter(prefix="/v1/default", tags=["documents"], route_class=HeedRoute)

ChunkLimit = Annotated[int, Query(ge=1, le=1000)]


@router.get("/banks/{bank_id}/documents/{document_id:document_path}/chunks")
async def list_document_chunks(
    bank_id: IdPath,
    document_id: IdPath,
    views: ViewsDep,
    limit: ChunkLimit = 100,
    offset: Offset = 0,
) -> wire.ListChunksResponse:
    """A page of the document's chunks, by chunk index."""
    chunks, total = await views.document_chunks(bank_id, document_id, limit, offset)
    return wire.ListChunksResponse(
        items=[wire.chunk_response(c) for c in chunks], total=total, limit=limit, offset=offset
    )


@router.get("/chunks/{chunk_id}")
async def get_chunk(chunk_id: IdPath, views: ViewsDep) -> wire.ChunkResponse:
    """One chunk of the caller's banks."""
    return wire.chunk_response(await views.chunk(chunk_id))
