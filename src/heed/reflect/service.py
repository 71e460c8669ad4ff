"""The reflect piece of a server: its provider (built once, lazily) and its agent."""

from __future__ import annotations

from heed.llm.base import ChatProvider
from heed.llm.gate import ProviderGates
from heed.llm.slot import ProviderSlot
from heed.memory import MemoryEngine
from heed.memory.models import Bank
from heed.reflect.agent import ReflectAgent, ReflectListener, ReflectOutcome, ReflectRequest
from heed.reflect.ports import MentalModelSource
from heed.runtime import Lane
from heed.settings import Settings

__all__ = ["ReflectService"]


class ReflectService:
    """Holds the reflect provider (``HEED_REFLECT_LLM_*``, else ``HEED_LLM_*``) and runs
    reflects with it.

    The provider is built on first use, so a server whose settings name a provider that
    cannot be built still starts. This service owns the rule **a reflect starts only when
    its provider can be built**: :meth:`run` and :meth:`check_provider` raise the
    provider's error (400 naming the unknown provider or model) before any work, and
    :meth:`heed.reflect.runs.ReflectRuns.submit` checks it before a run is written, so
    neither front end checks it itself. Tests may set ``provider`` directly.
    """

    def __init__(
        self,
        settings: Settings,
        engine: MemoryEngine,
        lane: Lane,
        mental_models: MentalModelSource | None = None,
        gates: ProviderGates | None = None,
    ) -> None:
        self.settings = settings
        self.gates = gates  # a remote provider's concurrency (heed.llm.gate)
        self.engine = engine
        self.lane = lane
        #: How reflects consult the bank's mental models first (``None``: they do not).
        self.mental_models = mental_models
        self._slot = ProviderSlot(self._build)

    def _build(self) -> ChatProvider:
        from heed.llm.factory import build_provider  # the provider's library loads on first use

        return build_provider(self.settings, "reflect", self.gates)

    @property
    def provider(self) -> ChatProvider:
        """The reflect provider, built on first use (raises its error)."""
        return self._slot.get()

    @provider.setter
    def provider(self, value: ChatProvider) -> None:
        self._slot.current = value

    def check_provider(self) -> None:
        """Raise the provider's error if the reflect provider cannot be built."""
        self._slot.get()

    def agent(self) -> ReflectAgent:
        """An agent over the bank engine with the reflect provider (raises its error)."""
        return ReflectAgent(self.engine, self.provider, self.lane, self.mental_models)

    async def run(
        self, bank: Bank, request: ReflectRequest, listener: ReflectListener | None = None
    ) -> ReflectOutcome:
        """One reflect of *bank* in a reflect lane slot (see :mod:`heed.reflect.agent`);
        the provider's error, before any work, when it cannot be built."""
        return await self.agent().run(bank, request, listener)

    async def close(self) -> None:
        """Release the provider (its HTTP connections), if one was built."""
        await self._slot.aclose()
