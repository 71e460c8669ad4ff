"""The run machinery and the session service of one server, as :class:`RunServices`.

:mod:`heed.services` builds every part and hands them over; this holder only starts
them (migrations, restart recovery, the reaper) and closes them, in that order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from heed.llm.base import ChatProvider
from heed.runs.broker import Broker
from heed.runs.manager import RunManager
from heed.runs.reaper import Reaper
from heed.runs.recovery import recover
from heed.runs.store import RunStore
from heed.sessions.service import SessionService
from heed.sessions.store import SessionStore
from heed.sessions.task import TaskRunner
from heed.sessions.tools import TurnTools
from heed.sessions.turn import TurnRunner
from heed.settings import Settings

__all__ = ["ProviderSlot", "RunServices"]


@dataclass
class ProviderSlot:
    """The turn provider, built on first use (a local model is expensive to load)."""

    factory: Callable[[], ChatProvider]
    current: ChatProvider | None = None

    def get(self) -> ChatProvider:
        if self.current is None:
            self.current = self.factory()
        return self.current

    async def aclose(self) -> None:
        if self.current is not None:
            await self.current.aclose()


@dataclass
class RunServices:
    """The run manager, the reaper, sessions and the turn and task workers of one server."""

    settings: Settings
    run_store: RunStore
    session_store: SessionStore
    broker: Broker
    manager: RunManager
    sessions: SessionService
    tools: TurnTools
    turns: TurnRunner
    tasks: TaskRunner
    turn_provider: ProviderSlot
    reaper: Reaper = field(init=False)

    def __post_init__(self) -> None:
        self.reaper = Reaper(self.manager)

    def provider(self) -> ChatProvider:
        """The turn provider (built on first use)."""
        return self.turn_provider.get()

    async def start(self) -> None:
        """Migrate, recover what a previous process left, start the reaper."""
        await self.manager.io.call(self.run_store.migrate)
        await self.manager.io.call(self.session_store.migrate)
        pending = await self.manager.io.call(self.session_store.pending_wakeups)
        await recover(self.manager, sorted({w.session_id for w in pending}))
        self.manager.start_cancel_listener()
        self.reaper.start()

    async def close(self) -> None:
        """Stop the reaper, interrupt this process's runs, release the provider."""
        await self.reaper.stop()
        await self.manager.close()
        await self.turn_provider.aclose()
