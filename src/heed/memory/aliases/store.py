"""What bank aliases need of storage (implemented by :mod:`heed.storage.memory.aliases`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from heed.memory.models import Bank

__all__ = ["AliasStore", "BankAlias"]


@dataclass(frozen=True, slots=True)
class BankAlias:
    """One extra id of a bank, and whether it is the one the bank is shown under."""

    alias: str
    primary: bool


class AliasStore(Protocol):
    """A tenant's aliases. Blocking; each write is one transaction."""

    def get_bank(self, tenant: str, bank_id: str) -> Bank | None:
        """The bank whose id, or else whose alias, is *bank_id*."""
        ...

    def aliases(self, bank_ref: str) -> list[BankAlias]:
        """The bank's aliases, the primary one first, then oldest first."""
        ...

    def primary_aliases(self, bank_refs: Sequence[str]) -> dict[str, str]:
        """The primary alias of each of *bank_refs* that has one."""
        ...

    def add_alias(self, bank: Bank, alias: str, primary: bool, limit: int) -> str | None:
        """Give *bank* the alias; ``None`` when done, else why not (the name is a bank's
        or an alias already, or the bank has *limit* aliases). A primary alias demotes the
        one shown before."""
        ...

    def set_alias_primary(self, bank_ref: str, alias: str, primary: bool) -> bool:
        """Show the bank under *alias* (or no longer); ``False`` when it has no such alias."""
        ...

    def delete_alias(self, bank_ref: str, alias: str) -> bool:
        """Remove the alias; ``False`` when the bank has no such alias."""
        ...
