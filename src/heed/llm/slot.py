"""A chat provider built on first use, and released at shutdown.

A provider can be expensive to build (the local model loads its weights) or impossible
(settings that name an unknown provider or model): building it on first use lets a server
start anyway and answer each request that needs it with the provider's own error (400
naming the unknown provider or model). Tests set :attr:`ProviderSlot.current` to put a
provider of their own in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from heed.llm.base import ChatProvider

__all__ = ["ProviderSlot"]


@dataclass
class ProviderSlot:
    """Holds one provider, built by *factory* on the first :meth:`get`."""

    factory: Callable[[], ChatProvider]
    current: ChatProvider | None = None

    def get(self) -> ChatProvider:
        """The provider; raises the factory's error (the next call tries again)."""
        if self.current is None:
            self.current = self.factory()
        return self.current

    async def aclose(self) -> None:
        """Release the provider (its connections, its model), if one was built."""
        if self.current is not None:
            provider, self.current = self.current, None
            await provider.aclose()
