"""Bank transfer's wire format (hindsight-client's ``bank_transfer`` and
``document_transfer`` APIs): what the submit routes answer (202). The transfer itself is an
operation: its status, progress and result (an export's ``download_url``, an import's
counts) are read at ``GET .../operations/{operation_id}``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = [
    "BankTransferSubmitResponse",
    "DocumentExportSubmitResponse",
    "DocumentImportSubmitResponse",
]


class BankTransferSubmitResponse(BaseModel):
    """An export, import or clone was queued as the operation ``operation_id``."""

    operation_id: str
    status: Literal["pending"] = "pending"


class DocumentExportSubmitResponse(BaseModel):
    """A documents export was queued as the operation ``operation_id``."""

    operation_id: str
    status: Literal["pending"] = "pending"


class DocumentImportSubmitResponse(BaseModel):
    """A merge of an archive's documents was queued as the operation ``operation_id``."""

    operation_id: str
    status: Literal["pending"] = "pending"
