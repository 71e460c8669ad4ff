"""How bank transfers are bounded (``HEED_TRANSFER_*``, ``HEED_EXPORT_TENANT_*``), and
the refusals at a bound: the name archives give this server's embedder, and what an
export's parameters digest to (the first half of its reuse key, see
:mod:`heed.transfer.runs`)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Final

from heed.errors import HeedError
from heed.memory.models import InvalidInput
from heed.runtime import ProcessLimits
from heed.settings import Settings
from heed.transfer.archive import ArchiveLimits
from heed.transfer.store import ExportQuota, ExportUsage

__all__ = [
    "ArchiveTooLarge",
    "ExportQuotaExceeded",
    "TransferLimits",
    "embedding_model",
    "export_key",
]


def embedding_model(settings: Settings) -> str:
    """The name archives give this server's embedder (:mod:`heed.memory.embeddings`)."""
    if settings.embeddings_provider == "openai":
        return f"openai:{settings.embeddings_model}"
    return "onnx:all-MiniLM-L6-v2-int8"


@dataclass(frozen=True, slots=True)
class TransferLimits:
    """How transfers are bounded (``HEED_TRANSFER_*``)."""

    archive: ArchiveLimits = field(default_factory=ArchiveLimits)
    #: Rows per page read from a bank.
    batch: int = 256
    #: How long an export's archive (and an upload waiting for its import) is kept.
    archive_ttl: float = 24 * 3600.0
    #: Most document ids one export names.
    max_document_ids: int = 500
    #: A tenant's stored exports (``None``: unbounded).
    export_quota: ExportQuota | None = None
    #: The process an upload is checked in: CPU seconds, added memory, priority.
    check: ProcessLimits = field(
        default_factory=lambda: ProcessLimits(
            cpu_seconds=900, memory_bytes=1024**3, wall_seconds=1800.0, nice=10
        )
    )


class ArchiveTooLarge(InvalidInput):
    """An upload whose check passed one of :attr:`TransferLimits.check` (413)."""

    status_code = 413
    _SETTINGS: Final = {
        "cpu": ("cpu_seconds", "seconds of CPU", "HEED_TRANSFER_CHECK_CPU_SECONDS"),
        "memory": ("memory_bytes", "bytes of memory", "HEED_TRANSFER_CHECK_MEMORY_BYTES"),
        "wall": ("wall_seconds", "seconds", "HEED_TRANSFER_CHECK_SECONDS"),
    }

    def __init__(self, limit: str, limits: ProcessLimits) -> None:
        field_name, what, setting = self._SETTINGS[limit]
        super().__init__(
            f"the archive takes more than {getattr(limits, field_name)} {what} to check ({setting})"
        )


class ExportQuotaExceeded(HeedError):
    """The tenant's stored exports are at its quota (429, ``Retry-After`` until the oldest
    expires); the message names the setting."""

    status_code = 429

    def __init__(self, usage: ExportUsage, quota: ExportQuota, adding: int = 0) -> None:
        wait = 1
        if usage.oldest_expires_at is not None:
            wait = max(1, math.ceil(usage.oldest_expires_at - time.time()))
        if usage.count + 1 > quota.max_count:
            bound = (
                f"{usage.count} exports stored, the most one tenant may have "
                f"(HEED_EXPORT_TENANT_MAX_COUNT={quota.max_count})"
            )
        else:
            bound = (
                f"{usage.byte_size} bytes of exports stored; "
                + (f"{adding} more" if adding else "more")
                + f" would pass the most one tenant may have "
                f"(HEED_EXPORT_TENANT_MAX_BYTES={quota.max_bytes})"
            )
        super().__init__(
            f"this tenant has {bound}; the oldest expires in {wait} s "
            "(HEED_TRANSFER_ARCHIVE_TTL_SECONDS); an export of a bank unchanged since its "
            "last export is reused, not stored again",
            headers={"Retry-After": str(wait)},
        )


def export_key(payload: dict[str, Any], model: str, dim: int) -> str:
    """What an export's parameters digest to (the first half of its reuse key)."""
    params = {
        name: payload.get(name)
        for name in (
            "bank_id",
            "scope",
            "document_ids",
            "include_observations",
            "include_data",
            "include_bank_config",
            "include_knowledge_base",
        )
    }
    text = json.dumps({**params, "model": model, "dim": dim}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
