"""The reflect piece of a server: its provider (built once, lazily) and its agent."""

from __future__ import annotations

from collections.abc import Callable

from heed.llm.base import ChatProvider
from heed.memory import MemoryEngine
from heed.reflect.agent import ReflectAgent
from heed.runtime import Lane
from heed.settings import Settings

__all__ = ["ReflectService"]


class ReflectService:
    """Holds the reflect provider (``HEED_REFLECT_LLM_*``, else ``HEED_LLM_*``).

    The provider is built on first use, so a server whose settings name a
    provider that cannot be built still starts, and each reflect answers with the
    provider's error (400 naming the unknown provider or model). Tests may set
    ``provider`` directly or pass a ``provider_factory``.
    """

    def __init__(
        self,
        settings: Settings,
        engine: MemoryEngine,
        lane: Lane,
        provider_factory: Callable[[], ChatProvider] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.lane = lane
        self._factory = provider_factory
        self._provider: ChatProvider | None = None

    @property
    def provider(self) -> ChatProvider:
        if self._provider is None:
            if self._factory is not None:
                self._provider = self._factory()
            else:
                from heed.llm.factory import build_provider

                self._provider = build_provider(self.settings, "reflect")
        return self._provider

    @provider.setter
    def provider(self, value: ChatProvider) -> None:
        self._provider = value

    def agent(self) -> ReflectAgent:
        return ReflectAgent(self.engine, self.provider, self.lane)

    async def close(self) -> None:
        """Release the provider (its HTTP connections), if one was built."""
        if self._provider is not None:
            await self._provider.aclose()
            self._provider = None
