"""The composition root: every long-lived part of one heed server, built once from settings.

Read top-down, this module is the server: lanes and the offload pool, the database and one
store per domain, signalling and the run manager, the domains, then every kind of run
registered with the manager. Nothing else constructs these parts; the HTTP routes receive
them as FastAPI dependencies (:mod:`heed.api.deps`), the MCP tools as the
:class:`Services` they were built over, and tests and the CLI build them with
:class:`Services`. The backends are chosen here and nowhere else: SQLite or PostgreSQL
(``HEED_DATABASE_URL``), in-process or Redis signals (``HEED_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from heed.llm.base import ChatProvider
from heed.llm.budget import LEARNING_KINDS, Budget, LlmBudgets
from heed.llm.factory import Operation
from heed.llm.gate import ProviderGates
from heed.llm.health import LlmHealth
from heed.llm.slot import ProviderSlot
from heed.llm.usage import add_call_admission, remove_call_admission, use_token_counter
from heed.llm.warmup import ModelWarmup
from heed.memory import (
    MemoryEngine,
    build_embedder,
    build_learning,
    build_memory_engine,
    shared_token_counter,
)
from heed.memory.aliases import BankAliases
from heed.memory.bank_config.service import BankConfigService
from heed.memory.bank_runs import RETAIN_KIND
from heed.memory.curation import MemoryCuration
from heed.memory.directives.service import DirectiveService
from heed.memory.files import FILE_PARSER_MODULES, FileLimits, FileRetain
from heed.memory.learning.consolidation import (
    CONSOLIDATION_KIND,
    Consolidation,
    ConsolidationLimits,
)
from heed.memory.models import Bank, NotFound
from heed.memory.retain.operations import RetainOperations
from heed.mental_models.knowledge import KnowledgeBase
from heed.mental_models.lookup import MentalModelLookup
from heed.mental_models.refresh import (
    MENTAL_MODEL_REFRESH_KIND,
    MentalModelRefreshes,
    RefreshLimits,
)
from heed.mental_models.service import MentalModels
from heed.mental_models.triggers import RefreshTriggers
from heed.observability import Observability
from heed.observability.service import Limits as ObservabilityLimits
from heed.reflect.runs import REFLECT_KIND, ReflectRuns
from heed.reflect.service import ReflectService
from heed.runs.broker import Broker, InProcessBroker
from heed.runs.kinds import KindSpec
from heed.runs.manager import RunManager
from heed.runs.model import Run
from heed.runs.reaper import Reaper
from heed.runs.recovery import recover
from heed.runtime import Lane, Lanes, ProcessLimits, helper_pool, run_in_thread
from heed.runtime.offload import (
    configure_thread_pool,
    preload_in_processes,
    start_process_server,
)
from heed.runtime.tracing import TracingState, configure_tracing, shutdown_tracing
from heed.sessions.service import TASK, TURN, SessionService
from heed.sessions.task import TaskRunner
from heed.sessions.tools import TurnTools
from heed.sessions.turn import TurnRunner
from heed.settings import Settings
from heed.storage import SqlDatabase, SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.observability_store import SqlObservabilityStore
from heed.storage.revocation_store import SqlRevocationStore
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import SqlSessionStore
from heed.storage.transfer.archives import SqlArchiveStore
from heed.storage.webhook_store import SqlWebhookStore
from heed.templates import BankTemplates
from heed.transfer.archive import ArchiveLimits
from heed.transfer.limits import TransferLimits, embedding_model
from heed.transfer.service import BankTransfers
from heed.transfer.store import ExportQuota
from heed.webhooks import DeliveryWorker, Webhooks
from heed.webhooks.worker import LogLimits, SendLimits

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["LANE_NAMES", "Services", "build_lanes"]

LANE_NAMES = ("parse", "recall", "reflect", "retain", "turn")
#: The lanes whose interactive work is CPU work (embedding, search, ranking): while it holds
#: as many of their slots as there are cores, background work in every lane waits.
CPU_LANES = ("recall", "retain")


def build_lanes(settings: Settings) -> Lanes:
    """One lane per kind of work, sized from settings.

    The recall lane keeps one slot for low-budget recalls (``HEED_RECALL_DEAR_CONCURRENCY``):
    a client looping high-budget recalls saturates every slot it may take, and without the
    spare slot every other recall waits for one of its recalls to finish.

    Background work's share is the same in every lane (``HEED_BACKGROUND_CAPACITY``, capped
    at the lane's slots; unset: all but one; ``HEED_BACKGROUND_MAX_DEFER_SECONDS``,
    ``HEED_BACKGROUND_MAX_QUEUE``), and background work also waits while interactive recalls
    and retains use every core (:data:`CPU_LANES`, :class:`heed.runtime.CpuBudget`).
    """
    recall = settings.recall_concurrency
    dear = {"recall": settings.recall_dear_concurrency or max(1, recall - 1)}
    return Lanes(
        Lane(
            name,
            getattr(settings, f"{name}_concurrency"),
            getattr(settings, f"{name}_queue"),
            max_wait=getattr(settings, f"{name}_max_wait_seconds"),
            dear_capacity=dear.get(name),
            background_capacity=settings.background_capacity,
            background_max_defer=settings.background_max_defer_seconds,
            background_max_queue=settings.background_max_queue,
            cpu_bound=name in CPU_LANES,
        )
        for name in LANE_NAMES
    )


def _database(settings: Settings) -> SqlDatabase:
    """PostgreSQL when ``HEED_DATABASE_URL`` names it, else the embedded file."""
    if settings.database_url is None:
        return SqliteDatabase(settings.database_path())
    from heed.storage.postgres import PostgresDatabase  # the driver loads only when used

    return PostgresDatabase(settings.database_url, pool_size=settings.database_pool_size)


def _broker(settings: Settings) -> Broker:
    """Redis pub/sub when ``HEED_REDIS_URL`` is set, else the in-process broker."""
    if settings.redis_url is None:
        return InProcessBroker()
    from heed.runs.redis_broker import RedisBroker  # redis loads only when used

    return RedisBroker(settings.redis_url, prefix=settings.redis_prefix)


def _secrets(settings: Settings) -> list[str]:
    """Every key the settings hold: masked in any LLM request trace that keeps text."""
    found: list[str] = list(settings.api_keys)
    for name in ("llm", "reflect_llm", "turn_llm", "retain_llm", "embeddings", "metrics"):
        value = getattr(settings, f"{name}_api_key" if name != "metrics" else "metrics_key")
        if value is not None:
            found.append(value.get_secret_value())
    return [s for s in found if s]


def _provider(settings: Settings, operation: Operation, gates: ProviderGates) -> ChatProvider:
    from heed.llm.factory import build_provider  # imports the provider's library on first use

    return build_provider(settings, operation, gates)


@dataclass
class Services:
    """What a running server holds, built from settings (see the module docstring).

    ``start()`` runs at server start-up (migrations, recovery); ``close()`` at shutdown.
    *span_exporters* replace the exporters ``OTEL_TRACES_EXPORTER`` names when tracing is
    on (tests pass an in-memory one).
    """

    settings: Settings
    span_exporters: Sequence[SpanExporter] | None = None
    tracing: TracingState = field(init=False)
    lanes: Lanes = field(init=False)
    llm_gates: ProviderGates = field(init=False)
    database: SqlDatabase = field(init=False)
    broker: Broker = field(init=False)
    memory: MemoryEngine = field(init=False)
    bank_config: BankConfigService = field(init=False)
    directives: DirectiveService = field(init=False)
    reflect: ReflectService = field(init=False)
    reflect_runs: ReflectRuns = field(init=False)
    retain_operations: RetainOperations = field(init=False)
    file_retain: FileRetain = field(init=False)
    transfers: BankTransfers = field(init=False)
    archive_store: SqlArchiveStore = field(init=False)
    run_store: SqlRunStore = field(init=False)
    session_store: SqlSessionStore = field(init=False)
    manager: RunManager = field(init=False)
    reaper: Reaper = field(init=False)
    sessions: SessionService = field(init=False)
    turn_provider: ProviderSlot = field(init=False)
    retain_provider: ProviderSlot = field(init=False)
    consolidation: Consolidation = field(init=False)
    llm_health: LlmHealth = field(init=False)
    mental_models: MentalModels = field(init=False)
    mental_model_triggers: RefreshTriggers = field(init=False)
    knowledge_base: KnowledgeBase = field(init=False)
    model_warmup: ModelWarmup = field(init=False)
    _process_server: asyncio.Future[None] | None = field(init=False, default=None)
    revocation_store: SqlRevocationStore = field(init=False)
    webhook_store: SqlWebhookStore = field(init=False)
    webhooks: Webhooks = field(init=False)
    webhook_worker: DeliveryWorker = field(init=False)
    observability_store: SqlObservabilityStore = field(init=False)
    observability: Observability = field(init=False)
    llm_budgets: LlmBudgets = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        # Traces first: everything built below may make spans (off: none, at no cost).
        self.tracing = configure_tracing(
            settings.tracing == "on",
            record_content=settings.tracing_record_content,
            exporters=self.span_exporters,
        )
        configure_thread_pool(settings.offload_threads)
        # The modules children of heed.runtime.run_in_process run: reflect's response_schema
        # validation, archive checks, file parsing with its libraries (a child then starts
        # in a few ms).
        preload_in_processes("heed.reflect.schema", "heed.transfer.check", *FILE_PARSER_MODULES)
        self.lanes = build_lanes(settings)
        # Remote LLM upstreams: their calls are network waits, bounded per upstream
        # (HEED_LLM_CONCURRENCY), not by the CPU lanes (heed.llm.gate).
        self.llm_gates = llm_gates = ProviderGates(
            settings.llm_concurrency,
            settings.llm_queue,
            background_max_defer=settings.background_max_defer_seconds,
            background_max_queue=settings.background_max_queue,
        )

        # Storage: one SQL database, one store per domain: the embedded SQLite file, or
        # PostgreSQL (pgvector) when HEED_DATABASE_URL names it. Runs and sessions share it
        # so their writes join one transaction.
        self.database = _database(settings)
        embedder = build_embedder(settings)
        memory_store = SqlMemoryStore(self.database, embedder.dim)  # pgvector on PostgreSQL
        self.run_store = run_store = SqlRunStore(self.database)
        self.session_store = session_store = SqlSessionStore(self.database)
        self.revocation_store = SqlRevocationStore(self.database)  # UI logouts
        self.archive_store = SqlArchiveStore(self.database)  # bank archives, in parts
        self.webhook_store = webhook_store = SqlWebhookStore(self.database)
        self.observability_store = SqlObservabilityStore(self.database)  # usage, traces, audit

        # Signalling and the run machinery: in-process, or Redis between processes.
        broker = _broker(settings)
        self.broker = broker
        self.manager = manager = RunManager(
            run_store,
            broker,
            lanes=self.lanes,
            unwind_window=settings.run_unwind_window,
            lease_seconds=settings.run_lease_seconds,
            reaper_interval=settings.run_reaper_interval,
            poll_interval=settings.stream_poll_seconds,
            # Redis carries other processes' events; without it the journal watches for them.
            watch_interval=settings.stream_watch_seconds if settings.redis_url is None else 0.0,
            # ... and a cancel written by another process reaches this one's workers.
            cancel_watch_interval=(
                settings.run_cancel_watch_seconds if settings.redis_url is None else 0.0
            ),
            journal_retention=settings.run_journal_retention_seconds,
            max_queued_per_session=settings.max_queued_turns_per_session,
            queue_sweep_interval=settings.run_queue_sweep_seconds,
        )
        self.reaper = Reaper(manager)

        # What LLM calls cost, their traces, and audit entries, per bank (issue 41, 40).
        self.observability = Observability(
            self.observability_store,
            helper_pool("heed-observability", 1),  # its writes in order, off the loop
            ObservabilityLimits(
                keep_content=settings.llm_request_log_content == "on",
                max_traces=settings.llm_request_log_max_per_bank,
                trace_max_age_days=settings.llm_request_log_max_age_days,
                max_audits=settings.audit_log_max_per_bank,
                audit_max_age_days=settings.audit_log_max_age_days,
            ),
            secrets=_secrets(settings),
        )
        manager.terminal_hooks.append(self._audit_run)
        # Banks' budgets of background LLM work, read from that usage (heed.llm.budget).
        self.llm_budgets = LlmBudgets(self._budget_of, self._spent_since)

        # The domains.
        # Extraction and consolidation share the retain provider (HEED_RETAIN_LLM_*).
        self.retain_provider = retain_provider = ProviderSlot(
            lambda: _provider(settings, "retain", llm_gates)
        )
        learning = build_learning(settings, retain_provider.get)
        self.memory = build_memory_engine(settings, memory_store, self.lanes, embedder, learning)
        self.memory.before_delete.append(self._forget_bank)
        self.memory.after_bank_change.append(lambda bank: self.llm_budgets.poke())
        self.bank_config = BankConfigService(self.memory)  # a bank's settings
        self.directives = DirectiveService(self.memory)  # a bank's rules for its agents
        self.aliases = BankAliases(self.memory, memory_store)  # extra ids of a bank
        # Every reflect consults the bank's mental models first (reflect's port, implemented
        # above it); refreshes and the knowledge base search and embed through the same lookup.
        lookup = MentalModelLookup(memory_store, embedder)
        self.reflect = ReflectService(
            settings, self.memory, self.lanes["reflect"], mental_models=lookup, gates=llm_gates
        )
        self.reflect_runs = ReflectRuns(manager, self.reflect)
        self.retain_operations = RetainOperations(manager, self.memory)
        # Edits, invalidation, clearing; a document retagged or retained again.
        self.curation = MemoryCuration(self.memory, memory_store, self.retain_operations)
        self.file_retain = FileRetain(
            self.memory,
            self.retain_operations,
            self.lanes["parse"],
            FileLimits(
                max_files=settings.file_max_files,
                max_bytes=settings.file_max_bytes,
                max_unpacked_bytes=settings.file_max_unpacked_bytes,
                max_text_chars=settings.file_max_text_chars,
                max_tags=settings.file_max_tags,
                max_cells=settings.file_max_cells,
                parse_cpu_seconds=settings.file_parse_cpu_seconds,
                parse_memory_bytes=settings.file_parse_memory_bytes,
                parse_seconds=settings.file_parse_seconds,
            ),
        )
        # Webhooks: the outbox is written in the transaction that ends any run of a bank;
        # the worker sends it (claims leased in the database: once across instances).
        self.webhooks = Webhooks(
            webhook_store,
            self.memory,
            allow_private=settings.webhook_allow_private,
            max_per_bank=settings.webhook_max_per_bank,
        )
        # Bank export, import and clone: runs of the bank's operations (archives in parts).
        self.transfers = BankTransfers(
            manager,
            self.memory,
            self.archive_store,
            memory_store,  # a bank's rows
            embedding_model(settings),
            TransferLimits(
                archive=ArchiveLimits(
                    max_unpacked_bytes=settings.transfer_max_unpacked_bytes,
                    max_records=settings.transfer_max_records,
                ),
                archive_ttl=settings.transfer_archive_ttl_seconds,
                check=ProcessLimits(
                    cpu_seconds=settings.transfer_check_cpu_seconds,
                    memory_bytes=settings.transfer_check_memory_bytes,
                    wall_seconds=settings.transfer_check_seconds,
                    nice=10,
                ),
                export_quota=ExportQuota(
                    settings.export_tenant_max_count, settings.export_tenant_max_bytes
                ),
            ),
            knowledge=memory_store,  # mental models and the knowledge base travel too
            webhooks=self.webhooks,  # and the bank's webhooks, with its config
        )
        self.sessions = sessions = SessionService(session_store, manager, self.memory)
        tools = TurnTools(self.memory, sessions.start_task)
        self.turn_provider = turn_provider = ProviderSlot(
            lambda: _provider(settings, "turn", llm_gates)
        )
        # Background LLM calls take reflect slots, behind every user's (heed.runtime.slots).
        self.consolidation = Consolidation(
            manager,
            self.memory,
            retain_provider.get,
            self.lanes["reflect"],
            ConsolidationLimits(
                batch=settings.consolidation_batch,
                debounce=settings.consolidation_debounce_seconds,
                max_seconds=settings.consolidation_max_seconds,
            ),
        )
        # Mental models and the knowledge base: refreshed by reflects (background slots),
        # consulted first by every reflect, refreshed again after retains and consolidations.
        refreshes = MentalModelRefreshes(
            manager,
            self.memory,
            self.reflect,
            memory_store,
            lookup,
            RefreshLimits(max_seconds=settings.mental_model_refresh_max_seconds),
        )
        self.mental_models = MentalModels(self.memory, memory_store, refreshes)
        self.templates = BankTemplates(self.memory, self.directives, self.mental_models)
        self.knowledge_base = KnowledgeBase(self.memory, memory_store, self.mental_models)
        self.mental_model_triggers = RefreshTriggers(
            refreshes, self.memory, memory_store, settings.mental_model_refresh_debounce_seconds
        )
        self.consolidation.after_consolidation.append(
            self.mental_model_triggers.after_consolidation
        )
        turns = TurnRunner(
            session_store,
            run_store,
            manager.io,
            turn_provider.get,
            tools,
            max_steps=settings.turn_max_steps,
            directives=self.directives.for_turn,
        )
        tasks = TaskRunner(tools, sessions.bank_of)

        # Every kind of run, registered in one place.
        manager.register(
            TURN,
            KindSpec(
                execute=turns.execute,
                exclusive=True,
                lane="turn",
                on_interrupted=turns.on_interrupted,
            ),
        )
        manager.register(
            TASK, KindSpec(execute=tasks.execute, on_terminal=sessions.record_task_wakeup)
        )
        manager.register(RETAIN_KIND, self.retain_operations.kind_spec())
        for kind, spec in self.transfers.kind_specs().items():
            manager.register(kind, spec)
        manager.register(REFLECT_KIND, self.reflect_runs.kind_spec())
        manager.register(CONSOLIDATION_KIND, self.consolidation.kind_spec())
        manager.register(MENTAL_MODEL_REFRESH_KIND, refreshes.kind_spec())

        manager.terminal_hooks.append(self.webhooks.on_terminal)
        self.webhook_worker = DeliveryWorker(
            webhook_store,
            manager.worker_id,
            allow_private=settings.webhook_allow_private,
            max_attempts=settings.webhook_max_attempts,
            backoff_seconds=settings.webhook_backoff_seconds,
            poll_seconds=settings.webhook_poll_seconds,
            lease_seconds=settings.webhook_lease_seconds,
            limits=SendLimits(
                concurrency=settings.webhook_concurrency,
                per_tenant=settings.webhook_concurrency_per_tenant,
                per_webhook=settings.webhook_concurrency_per_webhook,
                excerpt_bytes=settings.webhook_response_excerpt_bytes,
            ),
            log_limits=LogLimits(
                retention_seconds=settings.webhook_log_retention_seconds,
                max_per_webhook=settings.webhook_log_max_per_webhook,
                prune_interval=settings.webhook_prune_interval_seconds,
            ),
        )

        # What a bank's LLM probe asks (POST .../health/llm): the provider of each of its
        # operations (consolidation's is retain's: probed once).
        self.llm_health = LlmHealth(
            [
                ("retain", retain_provider.get),
                ("consolidation", retain_provider.get),
                ("reflect", lambda: self.reflect.provider),
            ]
        )

        # The LLMs' models load at start-up, beside serving (the reflect one, then turns').
        self.model_warmup = ModelWarmup(
            [("reflect", lambda: self.reflect.provider), ("turn", turn_provider.get)]
        )

    async def start(self) -> None:
        """Prepare storage and domain services; called once before serving."""
        await self.broker.start()  # fails fast when Redis is unreachable
        await run_in_thread(self._migrate)
        use_token_counter(shared_token_counter().count)  # for providers reporting no usage
        self.observability.start()
        add_call_admission(self.llm_budgets.admit)
        # After the other domains: recovery may start their runs.
        await recover(self.manager, await self.sessions.sessions_with_pending_wakeups())
        await self.consolidation.resume()  # banks whose facts a restart left pending
        await self.transfers.sweep()  # staging banks of imports a dead process left
        self.manager.start_cancel_listener()
        self.reaper.start()
        self.webhook_worker.start()
        self.model_warmup.start()  # in the background: serving does not wait for it
        # The fork server of run_in_process children (file parsing, schema checks), beside
        # serving too: its preload takes seconds that no request should wait for.
        self._process_server = asyncio.ensure_future(run_in_thread(start_process_server))

    def _migrate(self) -> None:
        """Bring every store's schema to this heed's version, in one place: each store
        applies its own migrations through the one runner
        (:func:`heed.storage.apply_migrations`)."""
        self.memory.store.migrate()
        self.run_store.migrate()
        self.session_store.migrate()
        self.revocation_store.migrate()
        self.archive_store.migrate()
        self.webhook_store.migrate()
        self.observability_store.migrate()

    def _audit_run(self, run: Run) -> None:
        """The run manager's terminal hook: an audit entry for the end of a bank's run."""
        bank_id = run.summary.get("bank_id")
        if not isinstance(bank_id, str):
            return
        self.observability.record_audit(
            tenant=run.tenant,
            bank_id=bank_id,
            action=f"run.{run.kind}",
            transport="system",
            started_at=run.started_at or run.created_at,
            ended_at=run.finished_at or time.time(),
            principal=None,
            response={"phase": run.phase, "error": run.error},
            metadata={"run_id": run.id, "kind": run.kind, "source": run.source},
        )

    async def _budget_of(self, tenant: str, bank_id: str) -> Budget | None:
        """A bank's LLM budgets as its settings say (``None``: the bank is gone)."""
        try:
            bank = await self.memory.get_bank(bank_id, tenant=tenant)
        except NotFound:
            return None
        settings = self.memory.settings(bank)
        return Budget(settings.llm_budget_tokens_per_hour, settings.llm_budget_tokens_per_day)

    async def _spent_since(self, tenant: str, bank_id: str, since: float) -> int:
        return await self.observability.spent(tenant, bank_id, LEARNING_KINDS, since)

    async def _forget_bank(self, bank: Bank) -> None:
        """The engine's ``before_delete`` hook: the bank's usage and traces go with it."""
        await self.observability.forget_bank(bank.tenant, bank.bank_id)

    async def close(self) -> None:
        """Release what ``start`` and the domains opened."""
        await self.model_warmup.aclose()
        if self._process_server is not None:
            await asyncio.gather(self._process_server, return_exceptions=True)
        await self.webhook_worker.aclose()  # sends in flight stop; their leases are given back
        await self.consolidation.aclose()
        await self.transfers.aclose()  # staging banks being deleted
        await self.mental_model_triggers.aclose()
        await self.reaper.stop()
        await self.manager.close()  # this process's runs end interrupted
        await self.turn_provider.aclose()
        await self.retain_provider.aclose()
        await self.reflect.close()
        await self.broker.aclose()
        remove_call_admission(self.llm_budgets.admit)
        await self.observability.close()  # after the runs: their last calls are written
        self.database.close()
        await run_in_thread(shutdown_tracing, self.tracing)  # flushes what is still batched
