"""The ASGI application: routes, error handlers and the lifecycle middleware."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp

from heed.api.admission import Admission
from heed.api.audit import audit_hook
from heed.api.auth import Authenticator
from heed.api.drain import Drain
from heed.api.errors import install_error_handlers
from heed.api.metrics import Metrics
from heed.api.middleware import RequestLifecycleMiddleware
from heed.api.openapi import install_openapi
from heed.api.readiness import Readiness
from heed.api.refresh_metrics import install_refresh_metrics
from heed.api.revocations import Revocations
from heed.api.routes import aliases as aliases_routes
from heed.api.routes import audit_logs as audit_logs_routes
from heed.api.routes import (
    auth,
    banks,
    chunks,
    diagnostics,
    documents,
    entities,
    extraction,
    files,
    llm_health,
    memories,
    observations,
    operations,
    reflect,
    system,
    unserved,
    views,
    webhooks,
)
from heed.api.routes import bank_config as bank_config_routes
from heed.api.routes import directives as directives_routes
from heed.api.routes import knowledge as knowledge_routes
from heed.api.routes import llm_requests as llm_requests_routes
from heed.api.routes import mental_models as mental_models_routes
from heed.api.routes import runs as runs_routes
from heed.api.routes import sessions as sessions_routes
from heed.api.routes import templates as templates_routes
from heed.api.routes import transfer as transfer_routes
from heed.api.routes.transfer import UPLOAD_PATHS
from heed.api.routing import HeedRoute
from heed.api.run_metrics import install_run_metrics
from heed.api.streams import StreamSlots
from heed.api.throttle import FailureThrottle
from heed.api.tracing import request_spans
from heed.api.uploads import SpoolBudget, spool_collector
from heed.mcp import build_mcp_server, http_endpoint
from heed.runtime.tracing import TracingState
from heed.services import Services
from heed.settings import Settings
from heed.version import __version__
from heed.web import mount_web

__all__ = ["HeedApp", "create_app"]


class HeedApp(FastAPI):
    """FastAPI with heed's lifecycle middleware outside FastAPI's own middleware.

    ``add_middleware`` would put it inside FastAPI's error, telemetry and body-limit
    middleware; as the real outermost callable, a request refused at the edge (drain,
    auth, admission) or abandoned before it reached a route costs none of them.
    """

    lifecycle: RequestLifecycleMiddleware | None = None
    tracing: TracingState | None = None

    def build_middleware_stack(self) -> ASGIApp:
        inner = super().build_middleware_stack()
        if self.lifecycle is None:
            return inner
        self.lifecycle.app = inner
        if self.tracing is not None and self.tracing.enabled:
            # Outside the lifecycle middleware, so a request refused at the edge has its
            # span too (heed.api.tracing); it passes receive through, hiding no disconnect.
            return request_spans(self.lifecycle, self.tracing)
        return self.lifecycle


def create_app(settings: Settings | None = None, services: Services | None = None) -> HeedApp:
    """Build the heed app; :class:`RequestLifecycleMiddleware` is outermost."""
    settings = settings or (services.settings if services else Settings())
    services = services or Services(settings)
    mcp = http_endpoint(build_mcp_server(services), settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with app.state.metrics.counting_llm():  # LLM retries and failures, while it serves
            await services.start()
            try:
                async with mcp.sessions():
                    yield
            finally:
                await app.state.readiness.aclose()  # probes still waiting on the database
                await services.close()

    # No redirect_slashes: an id ending in "/" would be redirected to another object's URL.
    # No /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from a CDN, into heed's
    # origin; the schema is at /openapi.json for any viewer a client runs itself.
    app = HeedApp(
        title="heed",
        version=__version__,
        lifespan=lifespan,
        redirect_slashes=False,
        docs_url=None,
        redoc_url=None,
    )
    app.router.route_class = HeedRoute  # routes the app adds itself (the UI's index) too
    app.state.services = services
    app.state.metrics = Metrics(
        services.lanes, lambda: [gate.lane for gate in services.llm_gates.all()]
    )
    app.state.burn_records = OrderedDict()
    app.state.authenticator = authenticator_of(settings)
    app.state.drain = Drain()
    app.state.readiness = Readiness(
        settings,
        services.database,
        services.broker,
        services.memory.embedder,
        services.model_warmup,
    )
    app.state.revocations = Revocations(services.revocation_store)
    app.state.admission = Admission(settings.max_in_flight, settings.tenant_max_in_flight)
    app.state.stream_slots = StreamSlots(settings.tenant_max_streams)
    app.state.spool = SpoolBudget(
        settings.upload_spool_dir,
        tenant_bytes=settings.upload_spool_tenant_bytes,
        total_bytes=settings.upload_spool_max_bytes,
        min_free_bytes=settings.upload_min_free_bytes,
    )
    app.state.metrics.registry.register(spool_collector(app.state.spool))
    install_error_handlers(app)
    memory_routers = (banks, views, observations, extraction, memories, entities, chunks)
    for memory_router in (*memory_routers, documents):
        app.include_router(memory_router.router)  # chunks before documents: see routes.chunks
    for memory_router in (operations, reflect, files, llm_health):
        app.include_router(memory_router.router)
    app.include_router(bank_config_routes.router)  # a bank's settings
    app.include_router(aliases_routes.router)  # extra ids of a bank
    app.include_router(templates_routes.router)  # a bank's setup exported and imported
    app.include_router(directives_routes.router)  # a bank's rules
    app.include_router(mental_models_routes.router)  # answers heed keeps fresh
    app.include_router(knowledge_routes.router)  # folders of mental-model pages
    app.include_router(transfer_routes.router)  # bank export, import, clone, downloads
    app.include_router(webhooks.router)
    app.include_router(llm_requests_routes.router)  # a bank's LLM request traces
    app.include_router(audit_logs_routes.router)  # who did what to a bank
    app.include_router(system.router)
    app.include_router(auth.router)
    app.include_router(runs_routes.router)
    app.include_router(sessions_routes.router)
    app.include_router(unserved.router)  # the client's routes heed answers 501
    install_run_metrics(app.state.metrics.registry, services.manager)
    install_refresh_metrics(app.state.metrics.registry, services.mental_models.refreshes)
    if settings.enable_diagnostics:
        app.include_router(diagnostics.router)
    app.router.routes.extend(mcp.routes)  # /mcp: heed's MCP server
    mount_web(app)
    install_openapi(app)
    app.tracing = services.tracing
    app.lifecycle = RequestLifecycleMiddleware(
        app.router,  # replaced by the whole stack when Starlette builds it
        metrics=app.state.metrics,
        authenticator=app.state.authenticator,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        upload_paths=UPLOAD_PATHS,
        drain=app.state.drain,
        admission=app.state.admission,
        public_admission=Admission(settings.public_max_in_flight),
        throttle=FailureThrottle(settings.auth_max_failures, settings.auth_failure_window_seconds),
        revocations=app.state.revocations,
        spool=app.state.spool,
        audit=audit_hook(services.observability),
    )
    return app


def authenticator_of(settings: Settings) -> Authenticator:
    """The request authenticator for *settings* (keys, Host allow-list, metrics key)."""
    return Authenticator(
        settings.api_keys,
        allowed_hosts=settings.allowed_hosts,
        metrics_key=settings.metrics_key.get_secret_value() if settings.metrics_key else None,
        session_seconds=int(settings.ui_session_hours * 3600),
    )
