"""What reflect needs from the capabilities above it, as small protocols (ports).

Reflect sits below mental models (a mental model's refresh is a reflect), yet every reflect
consults the bank's mental models first. It does so only through :class:`MentalModelSource`,
which :class:`heed.mental_models.lookup.MentalModelLookup` implements and the composition
root (:mod:`heed.services`) hands to :class:`heed.reflect.service.ReflectService`: reflect
imports nothing of :mod:`heed.mental_models`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from heed.memory.models import Bank

__all__ = ["ConsultedModel", "MentalModelSource"]


class ConsultedModel(Protocol):
    """A mental model as a reflect reads it: shown to the LLM as ``[mental model {id}]
    {name} ({source_query}): {content}`` and cited in ``based_on.mental_models``."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def source_query(self) -> str: ...

    @property
    def content(self) -> str: ...


class MentalModelSource(Protocol):
    """The bank's mental models a reflect consults before its first recall."""

    async def relevant(
        self, bank: Bank, query: str, exclude_ids: Sequence[str] = (), limit: int = 3
    ) -> Sequence[ConsultedModel]:
        """Up to *limit* of *bank*'s models with content that *query* finds, best first,
        except *exclude_ids*; none when the bank has none. Cancellable."""
        ...
