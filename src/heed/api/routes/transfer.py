"""Bank transfer (HTTP only; the rules and the work are :mod:`heed.transfer.service`'s):

- ``POST /v1/default/banks/{bank_id}/transfer/export``: export the bank (or documents of
  it) as an archive (docs/bank-archive.md);
- ``POST /v1/default/banks/{bank_id}/transfer/import``: import an archive (multipart
  ``file``) as a new bank (``target_bank_id``, default the archive's bank id), or, with
  ``mode=merge``, fold its documents into this bank (``document_conflict``: ``skip``,
  ``replace``, ``new-id``); a bad archive is a 400 naming the problem, and nothing is
  written. The bank and the options are checked before the upload's body is read, which
  is then streamed into one spool file (:mod:`heed.api.uploads`);
- ``POST /v1/default/banks/{bank_id}/document-transfer``: the same merge
  (``on_conflict``), hindsight-client's deprecated ``import_documents``;
- ``POST /v1/default/banks/{bank_id}/clone``: copy the bank into the new ``target_bank_id``;
- ``POST /v1/default/banks/{bank_id}/document-transfer/export``: export documents;
- ``GET /v1/default/files/download/{key}``: an export's archive (``application/zip``).

Each submit answers 202 with the operation's id: the work is a run of the bank's
operations (status, progress, result, cancel at ``.../operations/{operation_id}``, the
journal at ``/v1/runs/{id}/stream``). ``include_history`` is refused by name when true
(heed keeps no audit or LLM request log to carry).
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from heed.api.deps import MemoryDep, TransfersDep
from heed.api.input_rules import MAX_ID_CHARS, MAX_LIST_ITEMS, IdPath
from heed.api.openapi import CONFLICT, EXPORT_QUOTA, UPLOAD_REFUSED, upload_body
from heed.api.routing import HeedRoute
from heed.api.uploads import receive_archive
from heed.api.wire import transfer as wire
from heed.memory.engine import BANK_ID_RE
from heed.memory.models import Bank
from heed.runs.model import Run
from heed.transfer.service import BankTransfers, ImportOptions

router = APIRouter(tags=["transfer"], route_class=HeedRoute)

BANK = "/v1/default/banks/{bank_id}"
#: The routes that take a bank archive upload: bodies up to HEED_MAX_UPLOAD_BYTES, their
#: bytes claimed by the request middleware (:mod:`heed.api.middleware`) and read by the route
#: into one spool file (:mod:`heed.api.uploads`).
UPLOAD_PATHS: Final = re.compile(r"/v1/default/banks/[^/]+/(?:transfer/import|document-transfer)")
ARCHIVE_UPLOAD: Final = upload_body("file", "A heed bank archive (docs/bank-archive.md).")

DocumentIds = Annotated[
    list[Annotated[str, Query(min_length=1, max_length=MAX_ID_CHARS)]] | None,
    Query(max_length=MAX_LIST_ITEMS, description="Document id(s); omit for the whole bank."),
]
TargetBankId = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=BANK_ID_RE.pattern,
        description="The bank to create (it must not exist): 1-128 letters, digits, '.', '_', "
        "':', '@' or '-', starting with a letter or digit.",
    ),
]
IncludeData = Annotated[bool, Query(description="Carry the memories and what backs them.")]
IncludeConfig = Annotated[
    bool, Query(description="Carry the bank's configuration (mission, disposition, settings).")
]
MODE = "restore (into a new bank, the default) or merge (the documents, into this bank)"
RESTORE_DATA = "restore: carry the memories and what backs them (default true)"
RESTORE_CONFIG = (
    "restore: carry the settings, directives, webhooks and mental models (default true)"
)
IncludeHistory = Annotated[
    bool, Query(description="Hindsight's audit and LLM logs: heed keeps none (true is a 400).")
]


@router.post(f"{BANK}/transfer/export", status_code=202, responses=EXPORT_QUOTA)
async def export_bank(
    bank_id: IdPath,
    engine: MemoryDep,
    transfers: TransfersDep,
    include_data: IncludeData = True,
    include_bank_config: IncludeConfig = True,
    include_history: IncludeHistory = False,
    document_id: DocumentIds = None,
) -> wire.BankTransferSubmitResponse:
    """Export the bank (or the documents named) as an archive; the operation's result
    names its ``download_url``."""
    bank = await engine.get_bank(bank_id)
    run = await transfers.submit_export(
        bank,
        include_data=include_data,
        include_bank_config=include_bank_config,
        include_history=include_history,
        document_ids=document_id,
    )
    return wire.BankTransferSubmitResponse(operation_id=run.id)


@router.post(
    f"{BANK}/transfer/import",
    status_code=202,
    responses={**CONFLICT, **UPLOAD_REFUSED},
    openapi_extra=ARCHIVE_UPLOAD,
)
async def import_bank(
    bank_id: IdPath,
    request: Request,
    engine: MemoryDep,
    transfers: TransfersDep,
    mode: Annotated[str | None, Query(max_length=32, description=MODE)] = None,
    target_bank_id: TargetBankId | None = None,
    document_conflict: Annotated[
        str | None, Query(max_length=32, description="merge: skip (default), replace or new-id")
    ] = None,
    include_data: Annotated[bool | None, Query(description=RESTORE_DATA)] = None,
    include_bank_config: Annotated[bool | None, Query(description=RESTORE_CONFIG)] = None,
    include_history: IncludeHistory = False,
) -> wire.BankTransferSubmitResponse:
    """Check the archive whole (400 naming the problem; nothing written) and import it as
    the new bank ``target_bank_id`` (409 when it exists), or merge its documents into this
    bank (``mode=merge``), as an operation of this bank. The bank and the options are
    checked before the body is read."""
    bank = await engine.get_bank(bank_id)
    options = ImportOptions(
        target_bank_id=target_bank_id,
        mode=mode,
        document_conflict=document_conflict,
        include_data=include_data,
        include_bank_config=include_bank_config,
        include_history=include_history,
    )
    run = await _submit_import(bank, request, transfers, options)
    return wire.BankTransferSubmitResponse(operation_id=run.id)


@router.post(
    f"{BANK}/document-transfer",
    status_code=202,
    deprecated=True,
    responses=UPLOAD_REFUSED,
    openapi_extra=ARCHIVE_UPLOAD,
)
async def import_documents(
    bank_id: IdPath,
    request: Request,
    engine: MemoryDep,
    transfers: TransfersDep,
    on_conflict: Annotated[
        str | None, Query(max_length=32, description="skip (default), replace or new-id")
    ] = None,
) -> wire.DocumentImportSubmitResponse:
    """Merge the archive's documents into this bank: ``POST .../transfer/import`` with
    ``mode=merge`` (hindsight-client's deprecated ``import_documents``)."""
    bank = await engine.get_bank(bank_id)
    options = ImportOptions(mode="merge", document_conflict=on_conflict)
    run = await _submit_import(bank, request, transfers, options)
    return wire.DocumentImportSubmitResponse(operation_id=run.id)


async def _submit_import(
    bank: Bank, request: Request, transfers: BankTransfers, options: ImportOptions
) -> Run:
    """Check *options* for *bank* (before the body is read), then spool the upload and
    submit its import."""
    await transfers.check_import(bank, options)
    upload = await receive_archive(request)
    return await transfers.submit_import(bank, upload.file, upload.filename, options)


@router.post(f"{BANK}/clone", status_code=202, responses=CONFLICT)
async def clone_bank(
    bank_id: IdPath,
    target_bank_id: TargetBankId,
    engine: MemoryDep,
    transfers: TransfersDep,
    include_data: IncludeData = True,
    include_bank_config: IncludeConfig = True,
    include_history: IncludeHistory = False,
) -> wire.BankTransferSubmitResponse:
    """Copy the bank into the new bank ``target_bank_id`` (409 when it exists)."""
    bank = await engine.get_bank(bank_id)
    run = await transfers.submit_clone(
        bank,
        target_bank_id,
        include_data=include_data,
        include_bank_config=include_bank_config,
        include_history=include_history,
    )
    return wire.BankTransferSubmitResponse(operation_id=run.id)


@router.post(f"{BANK}/document-transfer/export", status_code=202, responses=EXPORT_QUOTA)
async def export_documents(
    bank_id: IdPath,
    engine: MemoryDep,
    transfers: TransfersDep,
    document_id: DocumentIds = None,
    include_observations: Annotated[
        bool, Query(description="Also the observations (whole bank only).")
    ] = False,
    include_knowledge_base: Annotated[
        bool, Query(description="Also the mental models and knowledge pages (whole bank only).")
    ] = False,
) -> wire.DocumentExportSubmitResponse:
    """Export the bank's documents (those named, else all) as an archive of ``documents``
    scope; the operation's result names its ``download_url``."""
    bank = await engine.get_bank(bank_id)
    run = await transfers.submit_export(
        bank,
        document_ids=document_id,
        documents_only=True,
        include_observations=include_observations,
        include_knowledge_base=include_knowledge_base,
    )
    return wire.DocumentExportSubmitResponse(operation_id=run.id)


@router.get(
    "/v1/default/files/download/{key}",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/zip": {}}, "description": "The archive."}},
)
async def download_file(key: IdPath, transfers: TransfersDep) -> StreamingResponse:
    """An export's archive, streamed from the database a part at a time."""
    archive = await transfers.download(key)
    return StreamingResponse(
        transfers.archive_bytes(archive),
        media_type="application/zip",
        headers={
            "Content-Length": str(archive.byte_size),
            "Content-Disposition": f'attachment; filename="{archive.filename}"',
            "X-Heed-Sha256": archive.sha256,
        },
    )
