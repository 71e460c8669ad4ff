"""File retain (``POST /v1/default/banks/{bank_id}/files/retain``): HTTP only.

The multipart form is read, its ``request`` field checked by the text rule and parsed
(400 naming a bad or unknown field), and the files handed to
:class:`heed.memory.files.FileRetain`, which owns every rule: limits, types, parsing in
the offload, document ids, sync or async retain. Like sync retain, it runs under the
request's token: a client that leaves stops the parsing and the embedding (499), and
nothing is written.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from pydantic import ValidationError

from heed.api.deps import FileRetainDep, MemoryDep
from heed.api.input_rules import MAX_LIST_ITEMS, IdPath, body_problem
from heed.api.routing import HeedRoute
from heed.api.wire import files as wire
from heed.memory.files import FileMeta, UploadedFile
from heed.memory.models import InvalidInput

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/files", tags=["files"], route_class=HeedRoute
)


def _request(raw: str) -> wire.FileRetainRequest:
    """The ``request`` field, parsed; 400 naming what is wrong."""
    problem = body_problem(raw.encode("utf-8", "surrogatepass"))
    if problem is not None:
        raise InvalidInput(problem.replace("the request body", "the request field"))
    try:
        return wire.FileRetainRequest.model_validate_json(raw or "{}")
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in error["loc"]) or "request"
        if error["type"] == "extra_forbidden":
            raise InvalidInput(f"request.{where} is not supported by heed") from None
        if error["type"] == "json_invalid":
            raise InvalidInput(f"the request field is not JSON: {error['msg']}") from None
        raise InvalidInput(f"request.{where}: {error['msg']}") from None


async def _uploaded(part: UploadFile | str) -> UploadedFile:
    """A multipart part as a file; a plain field (no file name) is a nameless file."""
    if isinstance(part, str):
        return UploadedFile("", None, part.encode("utf-8", "surrogatepass"))
    return UploadedFile(part.filename or "", part.content_type, await part.read())


@router.post("/retain")
async def retain_files(
    bank_id: IdPath,
    engine: MemoryDep,
    service: FileRetainDep,
    files: Annotated[
        list[UploadFile | str] | None,
        File(
            description="The files: each becomes a document (a part without a file name "
            "needs a document_id); HEED_FILE_MAX_FILES bounds how many.",
            max_length=MAX_LIST_ITEMS,
        ),
    ] = None,
    request: Annotated[
        str,
        Form(max_length=1_000_000, description="JSON: Hindsight's FileRetainRequest."),
    ] = "{}",
) -> wire.FileRetainResponse:
    """Parse each file (text, Markdown, HTML, PDF, docx, pptx, xlsx) and retain it as a
    document named by its file name (or its ``document_id``); ``async`` makes each an
    operation."""
    body = _request(request)
    bank = await engine.get_bank(bank_id)
    uploaded = [await _uploaded(f) for f in files or ()]
    metas = [
        FileMeta(
            context=m.context,
            document_id=m.document_id,
            tags=list(m.tags or []),
            metadata=dict(m.metadata or {}),
        )
        for m in body.files_metadata or []
    ]
    result = await service.retain(bank, uploaded, metas, async_=body.async_)
    return wire.FileRetainResponse.model_validate(
        {
            "operation_ids": result.operation_ids,
            "async": result.async_,
            "document_ids": result.document_ids,
            "items_count": result.items,
            "units_count": None if result.async_ else result.units,
        }
    )
