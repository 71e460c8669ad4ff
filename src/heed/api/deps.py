"""The one typed way the HTTP layer reaches what the server holds.

:func:`heed.api.app.create_app` puts the composition root (:class:`heed.services.Services`)
and the app's own edge parts (metrics, the drain, the authenticator, UI-session revocations,
the stream slots, the diagnostics' burn records) on ``app.state``; this module is the only
reader. A route declares what it needs as a parameter of one of the ``Annotated`` types
below, a FastAPI dependency::

    @router.post("/recall")
    async def recall(bank_id: IdPath, body: RecallRequest, engine: MemoryDep) -> ...

Code that is not a route but holds the app (the server's drain, the error handlers) uses
:func:`services_of` and the ``*_of`` functions. Every dependency is ``async``, so FastAPI
never runs it in its thread pool. ``tests/test_front_ends.py`` fails on any other module
that reads ``app.state``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends
from starlette.requests import Request
from starlette.types import ASGIApp

from heed.api.auth import Authenticator
from heed.api.drain import Drain
from heed.api.metrics import Metrics
from heed.api.readiness import Readiness
from heed.api.revocations import Revocations
from heed.api.streams import StreamSlots
from heed.api.wire.diagnostics import BurnRecord
from heed.memory import MemoryEngine
from heed.memory.aliases import BankAliases
from heed.memory.bank_config.service import BankConfigService
from heed.memory.curation import MemoryCuration
from heed.memory.directives.service import DirectiveService
from heed.memory.files import FileRetain
from heed.memory.learning.consolidation import Consolidation
from heed.memory.retain.operations import RetainOperations
from heed.memory.views.service import BankViews
from heed.mental_models.knowledge import KnowledgeBase
from heed.mental_models.service import MentalModels
from heed.reflect.runs import ReflectRuns
from heed.reflect.service import ReflectService
from heed.runs.manager import RunManager
from heed.services import Services
from heed.sessions.service import SessionService
from heed.settings import Settings
from heed.templates import BankTemplates
from heed.transfer.service import BankTransfers
from heed.webhooks import Webhooks

T = TypeVar("T")

__all__ = [
    "AliasesDep",
    "AuthenticatorDep",
    "BankConfigDep",
    "BurnRecordsDep",
    "ConsolidationDep",
    "CurationDep",
    "DirectivesDep",
    "DrainDep",
    "FileRetainDep",
    "KnowledgeBaseDep",
    "MemoryDep",
    "MentalModelsDep",
    "MetricsDep",
    "ReadinessDep",
    "ReflectDep",
    "ReflectRunsDep",
    "RetainOperationsDep",
    "RevocationsDep",
    "RunManagerDep",
    "ServicesDep",
    "SessionsDep",
    "SettingsDep",
    "StreamSlotsDep",
    "TemplatesDep",
    "TransfersDep",
    "ViewsDep",
    "WebhooksDep",
    "drain_of",
    "metrics_of",
    "services_of",
]


def _state(app: ASGIApp) -> Any:
    return app.state  # type: ignore[attr-defined]


def services_of(app: ASGIApp) -> Services:
    """The server's composition root."""
    services: Services = _state(app).services
    return services


def metrics_of(app: ASGIApp) -> Metrics:
    """The app's Prometheus metrics."""
    metrics: Metrics = _state(app).metrics
    return metrics


def drain_of(app: ASGIApp) -> Drain:
    """The app's drain (refuses new requests once the server shuts down)."""
    drain: Drain = _state(app).drain
    return drain


async def _services(request: Request) -> Services:
    return services_of(request.app)


ServicesDep = Annotated[Services, Depends(_services)]


def _of_services(part: Callable[[Services], T]) -> Callable[[Services], Awaitable[T]]:
    """A dependency that reads *part* of the composition root."""

    async def dependency(services: ServicesDep) -> T:
        return part(services)

    return dependency


def _of_state(name: str, kind: type[T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency that reads the app's edge part ``app.state.<name>``, a *kind*."""

    async def dependency(request: Request) -> T:
        found = getattr(_state(request.app), name)
        assert isinstance(found, kind), f"app.state.{name} is not a {kind.__name__}"
        return found

    return dependency


#: The memory engine (banks, retain, recall).
MemoryDep = Annotated[MemoryEngine, Depends(_of_services(lambda s: s.memory))]
#: Chat sessions: their rules, turns, status and channel.
SessionsDep = Annotated[SessionService, Depends(_of_services(lambda s: s.sessions))]
#: The run manager (runs, their journal, cancel).
RunManagerDep = Annotated[RunManager, Depends(_of_services(lambda s: s.manager))]
#: Reflect (its provider and agent).
ReflectDep = Annotated[ReflectService, Depends(_of_services(lambda s: s.reflect))]
#: Streamed reflects, as runs.
ReflectRunsDep = Annotated[ReflectRuns, Depends(_of_services(lambda s: s.reflect_runs))]
#: Async retains, as runs (Hindsight's operations).
RetainOperationsDep = Annotated[
    RetainOperations, Depends(_of_services(lambda s: s.retain_operations))
]
#: File retain (multipart files parsed into documents).
FileRetainDep = Annotated[FileRetain, Depends(_of_services(lambda s: s.file_retain))]
#: A bank's settings (GET / PATCH / DELETE .../config).
BankConfigDep = Annotated[BankConfigService, Depends(_of_services(lambda s: s.bank_config))]
#: Read-only views of a bank: entities, graphs, tags, observation scopes, chunks.
ViewsDep = Annotated[BankViews, Depends(_of_services(lambda s: BankViews(s.memory)))]
#: Bank templates (a bank's setup exported and imported).
TemplatesDep = Annotated[BankTemplates, Depends(_of_services(lambda s: s.templates))]
#: A bank's aliases (extra ids it answers to).
AliasesDep = Annotated[BankAliases, Depends(_of_services(lambda s: s.aliases))]
#: Curation of a bank's facts (edit, invalidate, revert) and clearing its memories.
CurationDep = Annotated[MemoryCuration, Depends(_of_services(lambda s: s.curation))]
#: A bank's directives.
DirectivesDep = Annotated[DirectiveService, Depends(_of_services(lambda s: s.directives))]
#: Webhooks: a bank's subscriptions and their delivery log.
WebhooksDep = Annotated[Webhooks, Depends(_of_services(lambda s: s.webhooks))]
#: Bank export, import and clone (runs of the bank's operations).
TransfersDep = Annotated[BankTransfers, Depends(_of_services(lambda s: s.transfers))]
#: Consolidation into observations (background runs).
ConsolidationDep = Annotated[Consolidation, Depends(_of_services(lambda s: s.consolidation))]
#: Mental models (their refreshes are runs).
MentalModelsDep = Annotated[MentalModels, Depends(_of_services(lambda s: s.mental_models))]
#: The knowledge base (folders and pages).
KnowledgeBaseDep = Annotated[KnowledgeBase, Depends(_of_services(lambda s: s.knowledge_base))]
#: The server's settings.
SettingsDep = Annotated[Settings, Depends(_of_services(lambda s: s.settings))]
#: The app's metrics.
MetricsDep = Annotated[Metrics, Depends(_of_state("metrics", Metrics))]
#: The app's readiness checks (GET /health/ready).
ReadinessDep = Annotated[Readiness, Depends(_of_state("readiness", Readiness))]
#: The app's drain.
DrainDep = Annotated[Drain, Depends(_of_state("drain", Drain))]
#: Who is asking: keys, UI sessions, CSRF.
AuthenticatorDep = Annotated[Authenticator, Depends(_of_state("authenticator", Authenticator))]
#: UI sessions ended by a logout.
RevocationsDep = Annotated[Revocations, Depends(_of_state("revocations", Revocations))]
#: Open streams per tenant.
StreamSlotsDep = Annotated[StreamSlots, Depends(_of_state("stream_slots", StreamSlots))]
#: The diagnostics' burn records (only with ``HEED_ENABLE_DIAGNOSTICS``).
BurnRecordsDep = Annotated[
    OrderedDict[str, BurnRecord], Depends(_of_state("burn_records", OrderedDict))
]
