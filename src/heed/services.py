"""The long-lived pieces of one heed server, built once from its settings.

The HTTP layer reaches them through ``request.app.state.services``; tests and
the CLI build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heed.memory import MemoryEngine, build_memory_engine
from heed.reflect.service import ReflectService
from heed.runtime import Lane, Lanes
from heed.runtime.offload import configure_thread_pool
from heed.sessions.wiring import RunServices
from heed.settings import Settings
from heed.storage import Database

__all__ = ["LANE_NAMES", "Services", "build_lanes"]

LANE_NAMES = ("recall", "reflect", "retain", "turn")


def build_lanes(settings: Settings) -> Lanes:
    """One lane per kind of work, sized from settings."""
    return Lanes(
        Lane(name, getattr(settings, f"{name}_concurrency"), getattr(settings, f"{name}_queue"))
        for name in LANE_NAMES
    )


@dataclass
class Services:
    """What a running server holds, built from settings.

    ``start()`` runs at server start-up (migrations, recovery); ``close()`` at
    shutdown. Each domain adds its own piece here and to those two methods.
    """

    settings: Settings
    lanes: Lanes = field(init=False)
    database: Database = field(init=False)
    runs: RunServices = field(init=False)
    memory: MemoryEngine = field(init=False)
    reflect: ReflectService = field(init=False)

    def __post_init__(self) -> None:
        configure_thread_pool(self.settings.offload_threads)
        self.lanes = build_lanes(self.settings)
        self.database = Database(self.settings.database_path())
        self.runs = RunServices(
            self.settings,
            self.database,
            self.lanes,
            memory=lambda: getattr(self, "memory", None),
        )
        self.memory = build_memory_engine(self.settings, self.database, self.lanes)
        self.reflect = ReflectService(self.settings, self.memory, self.lanes["reflect"])

    async def start(self) -> None:
        """Prepare storage and domain services; called once before serving."""
        await self.memory.start()
        await self.runs.start()  # after other domains: recovery may start their runs

    async def close(self) -> None:
        """Release what ``start`` and the domains opened."""
        await self.runs.close()
        await self.reflect.close()
        self.database.close()
