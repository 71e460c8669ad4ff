"""A tenant's bank configuration through the memory engine: read it resolved, change some
settings, reset it (the rules: :mod:`heed.memory.bank_config.settings`).

A change is validated whole before anything is written (a refused key or a bad value is a
400 naming it, and no setting changes), then applied and saved under the engine's bank lock
(:meth:`heed.memory.engine.MemoryEngine.change_bank`), so two changes of different settings
both land. Every call is tenant-scoped (another tenant's bank is a 404).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from heed.memory.bank_config import settings as bank_config
from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank

__all__ = ["BankConfigService", "BankConfigView"]


@dataclass(frozen=True, slots=True)
class BankConfigView:
    """A bank's configuration: every setting's value as it applies (``config``) and the
    bank's own (``overrides``)."""

    bank_id: str
    config: dict[str, Any]
    overrides: dict[str, Any]


class BankConfigService:
    """Read, change and reset the current tenant's bank settings (see the module
    docstring)."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine

    def view(self, bank: Bank) -> BankConfigView:
        """What ``GET .../config`` shows: the settings that apply
        (:meth:`heed.memory.engine.MemoryEngine.settings`) and the bank's own."""
        return BankConfigView(
            bank_id=bank.bank_id,
            config=self.engine.settings(bank).as_dict(),
            overrides=bank_config.overrides(bank),
        )

    async def read(self, bank_id: str) -> BankConfigView:
        """The bank's configuration (404 when it does not exist)."""
        return self.view(await self.engine.get_bank(bank_id))

    async def update(self, bank_id: str, updates: Mapping[str, Any]) -> BankConfigView:
        """Set *updates* (``null``: back to the default); 400 naming a refused key or a bad
        value before anything changes."""
        changes = bank_config.validate(updates)
        bank = await self.engine.change_bank(bank_id, lambda bank: bank_config.apply(bank, changes))
        return self.view(bank)

    async def reset(self, bank_id: str) -> BankConfigView:
        """Remove every setting of the bank's own: the server's defaults apply again."""
        return self.view(await self.engine.change_bank(bank_id, bank_config.reset))
