"""The memory store's part for bank aliases (:class:`heed.memory.aliases.AliasStore`).

``memory_bank_aliases`` (schema version 12) holds one row per alias, keyed by the tenant
and the alias, so an alias is unique among a tenant's aliases; that it names no bank is
checked in the transaction that adds it. Deleting a bank deletes its aliases (the cascade).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heed.memory.aliases.store import BankAlias
from heed.memory.models import Bank
from heed.storage.database import SqlDatabase
from heed.storage.memory.dialect import MemoryDialect
from heed.storage.memory.rows import bank_from_row, holds_nul, now_iso

__all__ = ["AliasRows"]


class AliasRows:
    """Aliases' reads and writes (see the module docstring)."""

    db: SqlDatabase
    dialect: MemoryDialect

    def bank_by_alias(self, conn: Any, tenant: str, alias: str) -> Bank | None:
        """The bank *alias* names for *tenant*, in the caller's transaction."""
        row = conn.execute(
            "SELECT b.* FROM memory_bank_aliases a JOIN memory_banks b ON b.ref = a.bank_ref"
            " WHERE a.tenant = ? AND a.alias = ?",
            (tenant, alias),
        ).fetchone()
        return bank_from_row(row) if row else None

    def aliases(self, bank_ref: str) -> list[BankAlias]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT alias, is_primary FROM memory_bank_aliases WHERE bank_ref = ?"
                " ORDER BY is_primary DESC, created_at, alias",
                (bank_ref,),
            ).fetchall()
        return [BankAlias(str(r[0]), bool(r[1])) for r in rows]

    def primary_aliases(self, bank_refs: Sequence[str]) -> dict[str, str]:
        if not bank_refs:
            return {}
        match, params = self.dialect.any_of("bank_ref", list(bank_refs), "text")
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT bank_ref, alias FROM memory_bank_aliases WHERE is_primary = 1 AND {match}",
                params,
            ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    def add_alias(self, bank: Bank, alias: str, primary: bool, limit: int) -> str | None:
        if holds_nul(alias):
            return f"{alias!r} cannot be an alias"
        with self.db.write() as conn:
            self.db.lock(conn, "aliases:" + bank.tenant)  # a name is taken once per tenant
            if conn.execute(
                "SELECT 1 FROM memory_banks WHERE tenant = ? AND bank_id = ?", (bank.tenant, alias)
            ).fetchone():
                return f"{alias!r} is already a bank's id"
            taken = conn.execute(
                "SELECT bank_ref FROM memory_bank_aliases WHERE tenant = ? AND alias = ?",
                (bank.tenant, alias),
            ).fetchone()
            if taken is not None:
                whose = "this bank's" if taken[0] == bank.ref else "another bank's"
                return f"{alias!r} is already {whose} alias"
            count = conn.execute(
                "SELECT COUNT(*) FROM memory_bank_aliases WHERE bank_ref = ?", (bank.ref,)
            ).fetchone()[0]
            if int(count) >= limit:
                return f"bank {bank.bank_id!r} has {limit} aliases, the most a bank may have"
            if primary:
                self._demote(conn, bank.ref)
            conn.execute(
                "INSERT INTO memory_bank_aliases (tenant, alias, bank_ref, is_primary, created_at)"
                " VALUES (?,?,?,?,?)",
                (bank.tenant, alias, bank.ref, 1 if primary else 0, now_iso()),
            )
        return None

    def set_alias_primary(self, bank_ref: str, alias: str, primary: bool) -> bool:
        if holds_nul(alias):
            return False
        with self.db.write() as conn:
            if not conn.execute(
                "SELECT 1 FROM memory_bank_aliases WHERE bank_ref = ? AND alias = ?",
                (bank_ref, alias),
            ).fetchone():
                return False
            if primary:
                self._demote(conn, bank_ref)
            conn.execute(
                "UPDATE memory_bank_aliases SET is_primary = ? WHERE bank_ref = ? AND alias = ?",
                (1 if primary else 0, bank_ref, alias),
            )
        return True

    def delete_alias(self, bank_ref: str, alias: str) -> bool:
        if holds_nul(alias):
            return False
        with self.db.write() as conn:
            deleted = conn.execute(
                "DELETE FROM memory_bank_aliases WHERE bank_ref = ? AND alias = ?",
                (bank_ref, alias),
            ).rowcount
        return bool(deleted)

    @staticmethod
    def _demote(conn: Any, bank_ref: str) -> None:
        conn.execute(
            "UPDATE memory_bank_aliases SET is_primary = 0 WHERE bank_ref = ? AND is_primary = 1",
            (bank_ref,),
        )
