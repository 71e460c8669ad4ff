"""Health, version and metrics.

- ``GET /health``: the process answers (``{"status": "healthy"}``), as before.
- ``GET /health/live``: Hindsight's liveness probe: the process answers; never touches the
  database, so a slow or unreachable one never gets the process restarted.
- ``GET /health/ready``: Hindsight's readiness probe: 200 when the database, the broker,
  the embedding model and (when it serves) the local LLM are ready, else 503 naming what
  is not (:mod:`heed.api.readiness`).
- ``GET /version``: versions, Hindsight's feature flags computed from the settings and the
  routes served (:mod:`heed.api.features`), and the LLM's load state.

The health routes are public and never counted by admission: probes must be answered
under any load.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from heed.api.deps import MetricsDep, ReadinessDep, ServicesDep
from heed.api.features import features
from heed.api.routing import HeedRoute
from heed.version import API_VERSION, __version__

router = APIRouter(tags=["system"], route_class=HeedRoute)


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the server answers."""
    return {"status": "healthy"}


class LivenessResponse(BaseModel):
    """Hindsight's ``LivenessResponse``."""

    status: Literal["alive"] = "alive"
    version: str
    uptime_seconds: float


class CheckOut(BaseModel):
    ready: bool
    detail: str


class ReadinessResponse(BaseModel):
    """``status`` ``healthy`` (200) or ``unhealthy`` (503, ``detail`` naming what is not
    ready); ``database`` in Hindsight's words; each check's finding."""

    status: Literal["healthy", "unhealthy"]
    database: Literal["connected", "error"]
    checks: dict[str, CheckOut]
    not_ready: list[str] = Field(default_factory=list)
    detail: str | None = None


@router.get("/health/live")
async def liveness(readiness: ReadinessDep) -> LivenessResponse:
    """Liveness probe: the process can serve a request (no database access)."""
    return LivenessResponse(version=__version__, uptime_seconds=round(readiness.uptime(), 3))


@router.get(
    "/health/ready",
    responses={503: {"model": ReadinessResponse, "description": "Not ready: `detail` says why"}},
)
async def readiness(readiness: ReadinessDep) -> JSONResponse:
    """Readiness probe: 200 when every check passes, 503 naming those that do not."""
    checks = await readiness.checks()
    failing = [c for c in checks if not c.ready]
    database = next(c for c in checks if c.name == "database")
    body = ReadinessResponse(
        status="unhealthy" if failing else "healthy",
        database="connected" if database.ready else "error",
        checks={c.name: CheckOut(ready=c.ready, detail=c.detail) for c in checks},
        not_ready=[c.name for c in failing],
        detail="not ready: " + "; ".join(f"{c.name}: {c.detail}" for c in failing)
        if failing
        else None,
    )
    return JSONResponse(body.model_dump(), status_code=503 if failing else 200)


@router.get("/version")
async def get_version(request: Request, services: ServicesDep) -> dict[str, object]:
    """The server's version and API version, Hindsight's feature flags (its client
    requires ``api_version`` and ``features``; each flag is computed from the settings and
    the routes this app serves), and whether the LLM's model has loaded (``llm.state``:
    ``loading``, ``ready`` or ``failed`` with its ``detail``)."""
    return {
        "api_version": __version__,
        "version": __version__,
        "api": API_VERSION,
        "features": features(
            request.app.routes,
            observations=services.memory.learning.observations_default,
            run_kinds=services.manager.kinds,
        ),
        "llm": services.model_warmup.status(),
    }


@router.get("/metrics", include_in_schema=False)
async def metrics(metrics: MetricsDep) -> Response:
    """Prometheus text: HTTP outcomes, cancellations by reason, lane counters."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
