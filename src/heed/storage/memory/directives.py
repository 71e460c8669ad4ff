"""The memory store's part for directives (:class:`heed.memory.store.DirectiveStore`).

One table, ``memory_directives`` (:mod:`heed.storage.memory.schema`, version 8), written in
the same SQL on SQLite and PostgreSQL: tags as JSON text, ``is_active`` as 0 or 1. Every
write is one transaction that first checks the bank's row (a bank another process deleted
is :class:`~heed.memory.store.BankGone`, and nothing is written); a create counts the
bank's directives under the bank's lock, so two creates racing for the last place cannot
both take it. An update changes the sent fields in one statement (``COALESCE``), so two
updates of different fields both land. The bank's row cascades to its directives.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from heed.errors import refuse_nul
from heed.memory.directives.rules import Directive, DirectivePatch, in_order
from heed.memory.store import BankGone
from heed.storage.memory.rows import holds_nul, now_iso

if TYPE_CHECKING:
    from heed.storage.database import SqlDatabase

__all__ = ["DirectiveWrites"]

_COLUMNS: Final = "id, bank_ref, name, content, priority, is_active, tags, created_at, updated_at"


def _directive(row: Any) -> Directive:
    return Directive(
        id=str(row["id"]),
        bank_ref=str(row["bank_ref"]),
        name=str(row["name"]),
        content=str(row["content"]),
        priority=int(row["priority"]),
        is_active=bool(row["is_active"]),
        tags=[str(t) for t in json.loads(row["tags"])],
        created_at=str(row["created_at"]),
        updated_at=str(row["updated_at"]),
    )


def _refuse_nul(
    name: str | None, content: str | None, tags: list[str] | None, directive_id: str = ""
) -> None:
    refuse_nul(directive_id, "the directive id")
    refuse_nul(name, "the directive's name")
    refuse_nul(content, "the directive's content")
    for i, tag in enumerate(tags or ()):
        refuse_nul(tag, f"the directive's tags[{i}]")


class DirectiveWrites:
    """A bank's directives (see the module docstring); a part of
    :class:`~heed.storage.memory.store.SqlMemoryStore`, which sets its database and the
    bank lock."""

    if TYPE_CHECKING:
        db: SqlDatabase

        def lock_bank(self, conn: Any, bank_ref: str) -> None: ...

    def _check_bank(self, conn: Any, bank_ref: str) -> None:
        """Raise :class:`BankGone` when the bank's row is gone (inside a write)."""
        row = conn.execute("SELECT 1 FROM memory_banks WHERE ref = ?", (bank_ref,)).fetchone()
        if row is None:
            raise BankGone(bank_ref)

    def create_directive(self, directive: Directive, limit: int) -> Directive | None:
        _refuse_nul(directive.name, directive.content, directive.tags, directive.id)
        now = now_iso()
        with self.db.write() as conn:
            self.lock_bank(conn, directive.bank_ref)
            self._check_bank(conn, directive.bank_ref)
            held = conn.execute(
                "SELECT COUNT(*) FROM memory_directives WHERE bank_ref = ?",
                (directive.bank_ref,),
            ).fetchone()[0]
            if int(held) >= limit:
                return None
            row = conn.execute(
                f"INSERT INTO memory_directives ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                f" RETURNING {_COLUMNS}",
                (
                    directive.id,
                    directive.bank_ref,
                    directive.name,
                    directive.content,
                    directive.priority,
                    int(directive.is_active),
                    json.dumps(directive.tags),
                    now,
                    now,
                ),
            ).fetchone()
        return _directive(row)

    def list_directives(self, bank_ref: str) -> list[Directive]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM memory_directives WHERE bank_ref = ?", (bank_ref,)
            ).fetchall()
        return in_order(_directive(r) for r in rows)

    def get_directive(self, bank_ref: str, directive_id: str) -> Directive | None:
        if holds_nul(directive_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM memory_directives WHERE bank_ref = ? AND id = ?",
                (bank_ref, directive_id),
            ).fetchone()
        return _directive(row) if row else None

    def update_directive(
        self, bank_ref: str, directive_id: str, patch: DirectivePatch
    ) -> Directive | None:
        if holds_nul(directive_id):
            return None
        _refuse_nul(patch.name, patch.content, patch.tags)
        tags = json.dumps(patch.tags) if patch.tags is not None else None
        active = int(patch.is_active) if patch.is_active is not None else None
        with self.db.write() as conn:
            self._check_bank(conn, bank_ref)
            row = conn.execute(
                "UPDATE memory_directives SET name = COALESCE(?, name),"
                " content = COALESCE(?, content), priority = COALESCE(?, priority),"
                " is_active = COALESCE(?, is_active), tags = COALESCE(?, tags), updated_at = ?"
                f" WHERE bank_ref = ? AND id = ? RETURNING {_COLUMNS}",
                (
                    patch.name,
                    patch.content,
                    patch.priority,
                    active,
                    tags,
                    now_iso(),
                    bank_ref,
                    directive_id,
                ),
            ).fetchone()
        return _directive(row) if row else None

    def delete_directive(self, bank_ref: str, directive_id: str) -> bool:
        if holds_nul(directive_id):
            return False
        with self.db.write() as conn:
            gone = conn.execute(
                "DELETE FROM memory_directives WHERE bank_ref = ? AND id = ? RETURNING id",
                (bank_ref, directive_id),
            ).fetchall()
        return bool(gone)
