"""Chunks (the raw text of a retained item as heed split and stored it) and a document's
history.

- ``GET /v1/default/banks/{bank_id}/documents/{document_id}/chunks``: a document's chunks
  by index, paged (a 404 naming an unknown document);
- ``GET /v1/default/chunks/{chunk_id}``: one chunk of any of the caller's banks (chunk ids
  are unique; another tenant's chunk is a 404 like an unknown one);
- ``GET /v1/default/banks/{bank_id}/documents/{document_id}/history``: **501** (after the
  bank's and the document's 404s), naming the route and why: :data:`HISTORY_NOT_KEPT`.

A chunk's ``created_at`` is its document's; heed keeps no attachments, so
``attachments`` is ``[]``. A document id may hold ``/`` (:mod:`heed.api.routes.documents`'s
path convertor): this router is included before the documents', so ``.../chunks`` at the
end of such a path names this route.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter

import heed.api.routes.documents  # noqa: F401  (registers the document_path convertor)
from heed.api.deps import ViewsDep
from heed.api.input_rules import IdPath
from heed.api.openapi import ErrorDetail
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.wire import views as wire
from heed.errors import HeedError

router = APIRouter(prefix="/v1/default", tags=["documents"], route_class=HeedRoute)

HISTORY_NOT_KEPT: Final = (
    "GET /v1/default/banks/{bank_id}/documents/{document_id}/history is not implemented by"
    " heed: heed keeps no per-document change log. A retain operation records the documents"
    " it wrote but not the facts each one gained or lost, and a synchronous retain, a memory"
    " delete or a consolidation records nothing per document, so a history rebuilt from what"
    " heed keeps would leave changes out or count them wrong."
)
"""Why a document's history is a 501 (the answer's ``detail``)."""

_NOT_IMPLEMENTED: Final[dict[int | str, dict[str, Any]]] = {
    501: {"model": ErrorDetail, "description": "Not implemented by heed; detail says why."}
}


@router.get("/banks/{bank_id}/documents/{document_id:document_path}/chunks")
async def list_document_chunks(
    bank_id: IdPath, document_id: IdPath, views: ViewsDep, page: PageDep
) -> wire.ListChunksResponse:
    """A page of the document's chunks, by chunk index."""
    chunks, total = await views.document_chunks(bank_id, document_id, page.limit, page.offset)
    return page.answer(wire.ListChunksResponse, [wire.chunk_response(c) for c in chunks], total)


@router.get("/chunks/{chunk_id}")
async def get_chunk(chunk_id: IdPath, views: ViewsDep) -> wire.ChunkResponse:
    """One chunk of the caller's banks."""
    return wire.chunk_response(await views.chunk(chunk_id))


@router.get(
    "/banks/{bank_id}/documents/{document_id:document_path}/history",
    responses=_NOT_IMPLEMENTED,
    response_model=None,
)
async def get_document_history(
    bank_id: IdPath, document_id: IdPath, views: ViewsDep, page: PageDep
) -> None:
    """501 (see :data:`HISTORY_NOT_KEPT`), once the bank and the document are found."""
    await views.document_chunks(bank_id, document_id, 0, 0)  # the 404s
    raise HeedError(HISTORY_NOT_KEPT, status_code=501)
