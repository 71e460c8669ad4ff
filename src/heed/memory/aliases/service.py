"""A bank's aliases over the memory engine (see the package docstring).

The bank named in the path may itself be given by an alias. A removed alias stops
reaching the bank in this process at once; another process may still resolve it from its
bank cache for up to :data:`heed.memory.engine.BANK_CACHE_SECONDS`.
"""

from __future__ import annotations

from typing import Final

from heed.memory.aliases.store import AliasStore, BankAlias
from heed.memory.engine import MemoryEngine, is_bank_id
from heed.memory.models import Bank, Conflict, InvalidInput, NotFound
from heed.runtime import current_context, run_in_thread

__all__ = ["MAX_ALIASES", "BankAliases"]

#: The most aliases one bank may have (each is a row read when a bank id misses).
MAX_ALIASES: Final = 64


class BankAliases:
    """The alias routes' work (module docstring)."""

    def __init__(self, engine: MemoryEngine, store: AliasStore) -> None:
        self.engine = engine
        self.store = store

    async def of_bank(self, bank_id: str) -> tuple[Bank, list[BankAlias]]:
        """The bank (by id or alias) and its aliases; :class:`NotFound`."""
        bank = await self.engine.get_bank(bank_id)
        return bank, await run_in_thread(self.store.aliases, bank.ref)

    async def display(
        self, banks: list[Bank], search: str | None
    ) -> tuple[dict[str, str], dict[str, list[str]]]:
        """For a page of the bank list: the alias each bank is shown under, by ref, and,
        for a *search* that matched a bank on an alias only, the aliases it matched."""
        refs = [bank.ref for bank in banks]
        shown = await run_in_thread(self.store.primary_aliases, refs)
        matched: dict[str, list[str]] = {}
        needle = (search or "").lower()
        for bank in banks:
            if needle and needle not in bank.bank_id.lower() and needle not in bank.name.lower():
                names = await run_in_thread(self.store.aliases, bank.ref)
                matched[bank.ref] = [a.alias for a in names if needle in a.alias.lower()]
        return shown, matched

    async def add(self, bank_id: str, alias: str, primary: bool) -> tuple[Bank, list[BankAlias]]:
        """Give the bank *alias*. Raises :class:`InvalidInput` (not a valid bank id),
        :class:`NotFound`, :class:`Conflict` (the name is taken, or the bank has
        :data:`MAX_ALIASES`)."""
        if not is_bank_id(alias):
            raise InvalidInput(
                f"invalid alias {alias!r}: an alias follows the rules of a bank id (1-128 "
                "letters, digits, '.', '_', ':', '@' or '-')"
            )
        bank = await self.engine.get_bank(bank_id)
        refused = await run_in_thread(self.store.add_alias, bank, alias, primary, MAX_ALIASES)
        if refused is not None:
            raise Conflict(refused)
        return bank, await run_in_thread(self.store.aliases, bank.ref)

    async def set_primary(
        self, bank_id: str, alias: str, primary: bool
    ) -> tuple[Bank, list[BankAlias]]:
        """Show the bank under *alias*, or no longer; :class:`NotFound` when it has none."""
        bank = await self.engine.get_bank(bank_id)
        if not await run_in_thread(self.store.set_alias_primary, bank.ref, alias, primary):
            raise NotFound(f"bank {bank.bank_id!r} has no alias {alias!r}")
        return bank, await run_in_thread(self.store.aliases, bank.ref)

    async def delete(self, bank_id: str, alias: str) -> tuple[Bank, list[BankAlias]]:
        """Stop *alias* reaching the bank; :class:`NotFound` when it has none."""
        bank = await self.engine.get_bank(bank_id)
        if not await run_in_thread(self.store.delete_alias, bank.ref, alias):
            raise NotFound(f"bank {bank.bank_id!r} has no alias {alias!r}")
        self.engine.forget_name(current_context().tenant, alias)
        return bank, await run_in_thread(self.store.aliases, bank.ref)
