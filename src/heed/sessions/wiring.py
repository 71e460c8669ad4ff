"""Builds the run machinery and the session service of one server (:class:`RunServices`).

``Services`` (``heed.services``) holds one :class:`RunServices` as ``runs``
and calls :meth:`RunServices.start` at start-up (migrations, restart recovery,
the reaper) and :meth:`RunServices.close` at shutdown. Other components reach
the manager as ``services.runs.manager`` to register their own kinds (for
example the memory engine's async ``retain``) before ``start``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heed.llm.base import ChatProvider
from heed.runs.broker import InProcessBroker
from heed.runs.kinds import KindSpec
from heed.runs.manager import RunManager
from heed.runs.reaper import Reaper
from heed.runs.recovery import recover
from heed.runtime import Lanes
from heed.sessions.service import TASK, TURN, SessionService
from heed.sessions.task import TaskRunner
from heed.sessions.tools import TurnTools
from heed.sessions.turn import TurnRunner
from heed.settings import Settings
from heed.storage import Database
from heed.storage.run_store import SqliteRunStore
from heed.storage.session_store import SqliteSessionStore

__all__ = ["RunServices"]


class RunServices:
    """The run manager, the reaper, sessions and the turn worker of one server."""

    def __init__(
        self,
        settings: Settings,
        database: Database,
        lanes: Lanes,
        *,
        memory: Callable[[], Any] = lambda: None,
        provider: Callable[[], ChatProvider] | None = None,
    ) -> None:
        self.settings = settings
        self.run_store = SqliteRunStore(database)
        self.session_store = SqliteSessionStore(database)
        self.broker = InProcessBroker()
        self.manager = RunManager(
            self.run_store,
            self.broker,
            lanes=lanes,
            unwind_window=settings.run_unwind_window,
            lease_seconds=settings.run_lease_seconds,
            reaper_interval=settings.run_reaper_interval,
            poll_interval=settings.stream_poll_seconds,
            journal_retention=settings.run_journal_retention_seconds,
        )
        self.sessions = SessionService(self.session_store, self.manager)
        self.reaper = Reaper(self.manager)
        self._provider: ChatProvider | None = None
        self._provider_factory = provider
        self.tools = TurnTools(memory, self.sessions.start_task)
        self.turns = TurnRunner(
            self.session_store,
            self.run_store,
            self.manager.io,
            self.provider,
            self.tools,
            max_steps=settings.turn_max_steps,
        )
        self.tasks = TaskRunner(self.tools, self.sessions.bank_of)
        self.manager.register(
            TURN,
            KindSpec(
                execute=self.turns.execute,
                exclusive=True,
                lane="turn",
                on_interrupted=self.turns.on_interrupted,
            ),
        )
        self.manager.register(
            TASK,
            KindSpec(execute=self.tasks.execute, on_terminal=self.sessions.record_task_wakeup),
        )

    def provider(self) -> ChatProvider:
        """The turn provider, built on first use from the ``turn`` LLM settings."""
        if self._provider is None:
            if self._provider_factory is not None:
                self._provider = self._provider_factory()
            else:
                from heed.llm.factory import build_provider

                self._provider = build_provider(self.settings, "turn")
        return self._provider

    async def start(self) -> None:
        """Migrate, recover what a previous process left, start the reaper."""
        await self.manager.io.call(self.run_store.migrate)
        await self.manager.io.call(self.session_store.migrate)
        pending = await self.manager.io.call(self.session_store.pending_wakeups)
        await recover(self.manager, sorted({w.session_id for w in pending}))
        self.reaper.start()

    async def close(self) -> None:
        """Stop the reaper, interrupt this process's runs, release the provider."""
        await self.reaper.stop()
        await self.manager.close()
        if self._provider is not None:
            await self._provider.aclose()
