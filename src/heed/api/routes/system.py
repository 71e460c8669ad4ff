"""Health, version and metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from heed.api.deps import MetricsDep, ServicesDep
from heed.api.routing import HeedRoute
from heed.version import API_VERSION, __version__

router = APIRouter(tags=["system"], route_class=HeedRoute)


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the server answers."""
    return {"status": "healthy"}


_FEATURES = {
    "observations": True,
    "mcp": True,
    "worker": True,
    "bank_config_api": False,
    "bank_llm_health": False,
    "file_upload_api": False,
    "document_export_api": False,
    "document_import_api": False,
    "audit_log": False,
    "llm_trace": False,
    "store_document_text": True,
}


@router.get("/version")
async def get_version(services: ServicesDep) -> dict[str, object]:
    """The server's version and API version, Hindsight's feature flags (its client
    requires ``api_version`` and ``features``), and whether the LLM's model has loaded
    (``llm.state``: ``loading``, ``ready`` or ``failed`` with its ``detail``)."""
    return {
        "api_version": __version__,
        "version": __version__,
        "api": API_VERSION,
        "features": _FEATURES,
        "llm": services.model_warmup.status(),
    }


@router.get("/metrics", include_in_schema=False)
async def metrics(metrics: MetricsDep) -> Response:
    """Prometheus text: HTTP outcomes, cancellations by reason, lane counters."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
