"""The memory store's part for mental models and the knowledge base (memory schema versions 9-10).

``memory_mental_models`` holds a bank's models (pages: ``is_page`` and a ``parent_id``
folder), their trigger and reflect response as JSON text and their embedding as float32
bytes; ``memory_mental_model_history`` their earlier contents (bounded per model, trimmed in
the write's transaction); ``memory_knowledge_folders`` the knowledge base's folders. Every
table names its bank with a foreign key that cascades, so deleting a bank deletes them, and
a model's history goes with the model. One text of SQL for both databases.

A model's ``source_fingerprint`` (version 10) is written with its content by a refresh and
read back by the next one (:mod:`heed.mental_models.fingerprint`); every other content write
(a clear) empties it, and a row copied in (a bank transfer) starts without one.

Writes take the bank's lock (the one documents and observations take) and read the bank's
row first: a bank deleted by another process is :class:`~heed.memory.store.BankGone` and
nothing is written. Tree rules (ids unique across models and folders, names unique among
siblings, a parent must be a folder, no folder under its own subtree) are checked inside the
same transaction, so two writers cannot both pass them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Final

import numpy as np

from heed.memory.models import Conflict, InvalidInput, NotFound, TagsMatch
from heed.memory.store import BankGone, UnitFilter
from heed.memory.tags import filters_by_tags
from heed.mental_models.values import (
    MAX_NODE_DEPTH,
    HistoryEntry,
    KnowledgeFolder,
    MentalModel,
    MentalModelRow,
)
from heed.storage.database import SqlDatabase, from_row
from heed.storage.memory.rows import holds_nul, loads, now_iso
from heed.storage.memory.writes import BANK_LOCK

__all__ = ["MentalModelWrites"]

_COLUMNS: Final = (
    "m.bank_ref, m.id, m.name, m.source_query, m.content, m.tags, m.max_tokens,"
    " m.trigger_settings, m.parent_id, m.is_page, m.reflect_response, m.created_at,"
    " m.updated_at, m.last_refreshed_at, m.last_refresh_failed_at,"
    " CASE WHEN m.last_refreshed_at IS NULL OR b.last_write_at > m.last_refreshed_at"
    " THEN 1 ELSE 0 END AS is_stale"
)
_FROM: Final = " FROM memory_mental_models m JOIN memory_banks b ON b.ref = m.bank_ref"


def _model(row: Any, embedding: bool) -> MentalModel:
    raw = row["embedding"] if embedding else None
    vector = None if raw is None else np.frombuffer(bytes(raw), dtype=np.float32).copy()
    response = row["reflect_response"]
    return from_row(
        MentalModel,
        row,
        ints=("max_tokens",),
        tags=list(loads(row["tags"]) or []),
        trigger=dict(loads(row["trigger_settings"])),
        is_page=bool(row["is_page"]),
        reflect_response=json.loads(response) if response else None,
        embedding=vector,
        is_stale=bool(row["is_stale"]),
    )


def _folder(row: Any) -> KnowledgeFolder:
    return from_row(KnowledgeFolder, row, managed=bool(row["managed"]))


def _vector(value: np.ndarray | None) -> bytes | None:
    return None if value is None else np.asarray(value, dtype=np.float32).tobytes()


def _insert_model(conn: Any, m: MentalModel) -> None:
    """Insert *m* as it is (its times included)."""
    conn.execute(
        "INSERT INTO memory_mental_models (bank_ref, id, name, source_query, content, tags,"
        " max_tokens, trigger_settings, parent_id, is_page, reflect_response, embedding,"
        " created_at, updated_at, last_refreshed_at, last_refresh_failed_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            m.bank_ref,
            m.id,
            m.name,
            m.source_query,
            m.content,
            json.dumps(m.tags),
            m.max_tokens,
            json.dumps(m.trigger),
            m.parent_id,
            1 if m.is_page else 0,
            json.dumps(m.reflect_response) if m.reflect_response else None,
            _vector(m.embedding),
            m.created_at,
            m.updated_at,
            m.last_refreshed_at,
            m.last_refresh_failed_at,
        ),
    )


def _refuse_nul(*texts: str | None) -> None:
    if holds_nul(*texts):
        raise InvalidInput("a mental model's text may not hold a NUL character (U+0000)")


class MentalModelWrites:
    """Mental models, their history and knowledge-base folders: the
    :class:`heed.mental_models.store.MentalModelStore` part of
    :class:`~heed.storage.memory.store.SqlMemoryStore` (see the module docstring)."""

    db: SqlDatabase
    _tags_clause: Callable[..., tuple[str, tuple[Any, ...]] | None]

    @contextmanager
    def _bank_write(self, bank_ref: str) -> Iterator[Any]:
        """A write transaction holding the bank's lock, its row checked first."""
        with self.db.write() as conn:
            self.db.lock(conn, BANK_LOCK + bank_ref)
            row = conn.execute("SELECT 1 FROM memory_banks WHERE ref = ?", (bank_ref,)).fetchone()
            if row is None:
                raise BankGone(bank_ref)
            yield conn

    # -- reads -------------------------------------------------------------------------

    def _models(self, conn: Any, where: str, params: tuple[Any, ...], embedding: bool) -> Any:
        columns = _COLUMNS + (", m.embedding" if embedding else "")
        rows = conn.execute(
            f"SELECT {columns}{_FROM} WHERE {where} ORDER BY m.created_at, m.id", params
        ).fetchall()
        return [_model(row, embedding) for row in rows]

    def mental_models(self, bank_ref: str, with_embeddings: bool = False) -> list[MentalModel]:
        with self.db.read() as conn:
            found: list[MentalModel] = self._models(
                conn, "m.bank_ref = ?", (bank_ref,), with_embeddings
            )
            return found

    def get_mental_model(self, bank_ref: str, model_id: str) -> MentalModel | None:
        if holds_nul(model_id):
            return None
        with self.db.read() as conn:
            found = self._models(conn, "m.bank_ref = ? AND m.id = ?", (bank_ref, model_id), True)
        return found[0] if found else None

    def mental_model_history(self, bank_ref: str, model_id: str) -> list[HistoryEntry]:
        if holds_nul(model_id):
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT version, previous_content, changed_at, reason"
                " FROM memory_mental_model_history WHERE bank_ref = ? AND mental_model_id = ?"
                " ORDER BY version DESC",
                (bank_ref, model_id),
            ).fetchall()
        return [
            HistoryEntry(int(r["version"]), r["previous_content"], r["changed_at"], r["reason"])
            for r in rows
        ]

    def refresh_fingerprint(self, bank_ref: str, model_id: str) -> str | None:
        if holds_nul(model_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT source_fingerprint FROM memory_mental_models WHERE bank_ref = ? AND id = ?",
                (bank_ref, model_id),
            ).fetchone()
        return None if row is None else row[0]

    def scope_digest(
        self,
        bank_ref: str,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
        fact_types: Sequence[str] | None,
    ) -> list[int]:
        """``[count, sum of seqs, greatest generation, sum of generations]`` of the bank's
        units that pass the tag filter (``tags`` per ``tags_match``: recall's rule) and are
        of *fact_types* (``None``: any). Units are written once (a change is a delete and an
        insert, and an insert carries the bank's next generation), so any unit added to or
        removed from the scope changes it."""
        if holds_nul(*(tags or ()), *(fact_types or ())):
            return [0, 0, 0, 0]
        where = ["bank_ref = ?"]
        params: list[Any] = [bank_ref]
        if fact_types is not None:
            if not fact_types:
                return [0, 0, 0, 0]
            marks = ", ".join("?" for _ in fact_types)
            where.append(f"fact_type IN ({marks})")
            params.extend(fact_types)
        with self.db.read() as conn:
            if filters_by_tags(tags, tags_match):
                tagged = self._tags_clause(
                    conn,
                    " AND ".join(where),
                    params,
                    UnitFilter(tags=tags, tags_match=tags_match),
                )
                if tagged is None:
                    return [0, 0, 0, 0]
                where.append(tagged[0])
                params.extend(tagged[1])
            row = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(seq), 0), COALESCE(MAX(generation), 0),"
                f" COALESCE(SUM(generation), 0) FROM memory_units WHERE {' AND '.join(where)}",
                params,
            ).fetchone()
        return [int(value) for value in row]

    def knowledge_folders(self, bank_ref: str) -> list[KnowledgeFolder]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM memory_knowledge_folders WHERE bank_ref = ? ORDER BY created_at, id",
                (bank_ref,),
            ).fetchall()
        return [_folder(row) for row in rows]

    # -- tree rules (inside a write) -----------------------------------------------------

    def _id_taken(self, conn: Any, bank_ref: str, node_id: str) -> bool:
        for table in ("memory_mental_models", "memory_knowledge_folders"):
            row = conn.execute(
                f"SELECT 1 FROM {table} WHERE bank_ref = ? AND id = ?", (bank_ref, node_id)
            ).fetchone()
            if row is not None:
                return True
        return False

    def _check_parent(self, conn: Any, bank_ref: str, parent_id: str | None) -> None:
        if parent_id is None:
            return
        row = conn.execute(
            "SELECT 1 FROM memory_knowledge_folders WHERE bank_ref = ? AND id = ?",
            (bank_ref, parent_id),
        ).fetchone()
        if row is None:
            raise NotFound(f"knowledge-base folder {parent_id!r} not found")

    def _check_name(
        self, conn: Any, bank_ref: str, parent_id: str | None, name: str, node_id: str
    ) -> None:
        """A node named *name* under *parent_id* other than *node_id*: :class:`Conflict`.
        Only the knowledge base's nodes (folders and pages) count."""
        parent = "parent_id IS NULL" if parent_id is None else "parent_id = ?"
        args: tuple[Any, ...] = (bank_ref, name, node_id) + (
            () if parent_id is None else (parent_id,)
        )
        for table, extra in (
            ("memory_knowledge_folders", ""),
            ("memory_mental_models", " AND is_page = 1"),
        ):
            row = conn.execute(
                f"SELECT 1 FROM {table} WHERE bank_ref = ? AND name = ? AND id <> ?"
                f" AND {parent}{extra}",
                args,
            ).fetchone()
            if row is not None:
                where = f"folder {parent_id!r}" if parent_id is not None else "the root"
                raise Conflict(f"a knowledge-base node named {name!r} exists in {where} already")

    def _count(self, conn: Any, table: str, bank_ref: str) -> int:
        return int(
            conn.execute(
                f"SELECT COUNT(*) FROM {table} WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
        )

    # -- models --------------------------------------------------------------------------

    def create_mental_model(self, model: MentalModel, limit: int) -> MentalModel:
        _refuse_nul(model.id, model.name, model.source_query, model.content, *model.tags)
        now = now_iso()
        with self._bank_write(model.bank_ref) as conn:
            if self._count(conn, "memory_mental_models", model.bank_ref) >= limit:
                raise InvalidInput(f"the bank holds {limit} mental models, the most it may hold")
            if self._id_taken(conn, model.bank_ref, model.id):
                raise Conflict(f"mental model {model.id!r} exists already")
            if model.is_page:
                self._check_parent(conn, model.bank_ref, model.parent_id)
                self._check_name(conn, model.bank_ref, model.parent_id, model.name, model.id)
            _insert_model(conn, replace(model, created_at=now, updated_at=now))
            created = self._models(
                conn, "m.bank_ref = ? AND m.id = ?", (model.bank_ref, model.id), True
            )
        return created[0]  # type: ignore[no-any-return]

    def update_mental_model(
        self, bank_ref: str, model_id: str, changes: dict[str, Any]
    ) -> MentalModel | None:
        if holds_nul(model_id):
            return None
        _refuse_nul(changes.get("name"), changes.get("source_query"), *changes.get("tags") or [])
        encoders: dict[str, Callable[[Any], Any]] = {
            "name": lambda v: v,
            "source_query": lambda v: v,
            "tags": json.dumps,
            "max_tokens": int,
            "trigger": json.dumps,
            "parent_id": lambda v: v,
            "embedding": _vector,
        }
        column = {"trigger": "trigger_settings"}
        with self._bank_write(bank_ref) as conn:
            found = self._models(conn, "m.bank_ref = ? AND m.id = ?", (bank_ref, model_id), False)
            if not found:
                return None
            current: MentalModel = found[0]
            if current.is_page and ("name" in changes or "parent_id" in changes):
                parent = changes.get("parent_id", current.parent_id)
                self._check_parent(conn, bank_ref, parent)
                self._check_name(
                    conn, bank_ref, parent, changes.get("name", current.name), model_id
                )
            sets = [f"{column.get(k, k)} = ?" for k in changes if k in encoders]
            values = [encoders[k](v) for k, v in changes.items() if k in encoders]
            if sets:
                conn.execute(
                    f"UPDATE memory_mental_models SET {', '.join(sets)}, updated_at = ?"
                    " WHERE bank_ref = ? AND id = ?",
                    (*values, now_iso(), bank_ref, model_id),
                )
            updated = self._models(conn, "m.bank_ref = ? AND m.id = ?", (bank_ref, model_id), True)
        return updated[0]  # type: ignore[no-any-return]

    def write_mental_model_content(
        self,
        bank_ref: str,
        model_id: str,
        content: str,
        reflect_response: dict[str, Any] | None,
        embedding: np.ndarray | None,
        *,
        reason: str,
        history_limit: int,
        refreshed: bool,
        fingerprint: str | None = None,
    ) -> MentalModel | None:
        if holds_nul(model_id):
            return None
        _refuse_nul(content)
        now = now_iso()
        with self._bank_write(bank_ref) as conn:
            row = conn.execute(
                "SELECT content FROM memory_mental_models WHERE bank_ref = ? AND id = ?"
                f"{self.db.for_update}",
                (bank_ref, model_id),
            ).fetchone()
            if row is None:
                return None
            previous = row["content"]
            if previous and previous != content:
                last = conn.execute(
                    "SELECT COALESCE(MAX(version), 0) FROM memory_mental_model_history"
                    " WHERE bank_ref = ? AND mental_model_id = ?",
                    (bank_ref, model_id),
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO memory_mental_model_history (bank_ref, mental_model_id,"
                    " version, previous_content, changed_at, reason) VALUES (?, ?, ?, ?, ?, ?)",
                    (bank_ref, model_id, int(last) + 1, previous, now, reason),
                )
                conn.execute(
                    "DELETE FROM memory_mental_model_history"
                    " WHERE bank_ref = ? AND mental_model_id = ? AND version <= ?",
                    (bank_ref, model_id, int(last) + 1 - max(0, history_limit)),
                )
            conn.execute(
                "UPDATE memory_mental_models SET content = ?, reflect_response = ?,"
                " embedding = COALESCE(?, embedding), updated_at = ?,"
                " last_refreshed_at = CASE WHEN ? = 1 THEN ? ELSE last_refreshed_at END,"
                " source_fingerprint = ?"
                " WHERE bank_ref = ? AND id = ?",
                (
                    content,
                    json.dumps(reflect_response) if reflect_response is not None else None,
                    _vector(embedding),
                    now,
                    1 if refreshed else 0,
                    now,
                    fingerprint,
                    bank_ref,
                    model_id,
                ),
            )
            written = self._models(conn, "m.bank_ref = ? AND m.id = ?", (bank_ref, model_id), True)
        return written[0]  # type: ignore[no-any-return]

    def mark_refresh_skipped(self, bank_ref: str, model_id: str, fingerprint: str) -> bool:
        if holds_nul(model_id):
            return False
        with self._bank_write(bank_ref) as conn:
            done = conn.execute(
                "UPDATE memory_mental_models SET last_refreshed_at = ?"
                " WHERE bank_ref = ? AND id = ? AND source_fingerprint = ? RETURNING id",
                (now_iso(), bank_ref, model_id, fingerprint),
            ).fetchall()
        return bool(done)

    def mark_refresh_failed(self, bank_ref: str, model_id: str) -> None:
        if holds_nul(model_id):
            return
        with self.db.write() as conn:
            conn.execute(
                "UPDATE memory_mental_models SET last_refresh_failed_at = ?"
                " WHERE bank_ref = ? AND id = ?",
                (now_iso(), bank_ref, model_id),
            )

    def delete_mental_model(self, bank_ref: str, model_id: str) -> bool:
        if holds_nul(model_id):
            return False
        with self._bank_write(bank_ref) as conn:
            return _delete_model(conn, bank_ref, model_id)

    def write_knowledge_rows(
        self,
        bank_ref: str,
        folders: Sequence[KnowledgeFolder],
        models: Sequence[MentalModelRow],
    ) -> int:
        if any(holds_nul(f.id, f.name) for f in folders):
            raise InvalidInput("a knowledge-base folder's text may not hold NUL (U+0000)")
        for row in models:
            m = row.model
            _refuse_nul(m.id, m.name, m.source_query, m.content, *m.tags)
            _refuse_nul(*(h.previous_content for h in row.history))
        with self._bank_write(bank_ref) as conn:
            for folder in folders:
                conn.execute(
                    "INSERT INTO memory_knowledge_folders (bank_ref, id, name, parent_id,"
                    " managed, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        bank_ref,
                        folder.id,
                        folder.name,
                        folder.parent_id,
                        1 if folder.managed else 0,
                        folder.created_at,
                        folder.updated_at,
                    ),
                )
            for row in models:
                _insert_model(conn, replace(row.model, bank_ref=bank_ref))
                m = row.model
                for entry in row.history:
                    conn.execute(
                        "INSERT INTO memory_mental_model_history (bank_ref, mental_model_id,"
                        " version, previous_content, changed_at, reason)"
                        " VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            bank_ref,
                            m.id,
                            entry.version,
                            entry.previous_content,
                            entry.changed_at,
                            entry.reason,
                        ),
                    )
        return len(folders) + len(models)

    # -- folders -------------------------------------------------------------------------

    def create_knowledge_folder(self, folder: KnowledgeFolder, limit: int) -> KnowledgeFolder:
        _refuse_nul(folder.id, folder.name)
        now = now_iso()
        with self._bank_write(folder.bank_ref) as conn:
            if self._count(conn, "memory_knowledge_folders", folder.bank_ref) >= limit:
                raise InvalidInput(f"the bank holds {limit} knowledge-base folders, the most")
            if self._id_taken(conn, folder.bank_ref, folder.id):
                raise Conflict(f"knowledge-base node {folder.id!r} exists already")
            self._check_parent(conn, folder.bank_ref, folder.parent_id)
            if len(self._ancestors(conn, folder.bank_ref, folder.parent_id)) >= MAX_NODE_DEPTH:
                raise InvalidInput(f"the knowledge base nests at most {MAX_NODE_DEPTH} deep")
            self._check_name(conn, folder.bank_ref, folder.parent_id, folder.name, folder.id)
            conn.execute(
                "INSERT INTO memory_knowledge_folders (bank_ref, id, name, parent_id, managed,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    folder.bank_ref,
                    folder.id,
                    folder.name,
                    folder.parent_id,
                    1 if folder.managed else 0,
                    now,
                    now,
                ),
            )
        folder.created_at = folder.updated_at = now
        return folder

    def _ancestors(self, conn: Any, bank_ref: str, folder_id: str | None) -> list[str]:
        """*folder_id* and the folders above it, nearest first (bounded)."""
        chain: list[str] = []
        while folder_id is not None and len(chain) <= MAX_NODE_DEPTH:
            chain.append(folder_id)
            row = conn.execute(
                "SELECT parent_id FROM memory_knowledge_folders WHERE bank_ref = ? AND id = ?",
                (bank_ref, folder_id),
            ).fetchone()
            folder_id = row["parent_id"] if row is not None else None
        return chain

    def update_knowledge_folder(
        self, bank_ref: str, folder_id: str, changes: dict[str, Any]
    ) -> KnowledgeFolder | None:
        if holds_nul(folder_id):
            return None
        _refuse_nul(changes.get("name"))
        with self._bank_write(bank_ref) as conn:
            row = conn.execute(
                "SELECT * FROM memory_knowledge_folders WHERE bank_ref = ? AND id = ?",
                (bank_ref, folder_id),
            ).fetchone()
            if row is None:
                return None
            folder = _folder(row)
            name = changes.get("name", folder.name)
            parent = changes.get("parent_id", folder.parent_id)
            if "parent_id" in changes and parent is not None:
                self._check_parent(conn, bank_ref, parent)
                above = self._ancestors(conn, bank_ref, parent)
                if folder_id in above:
                    raise InvalidInput(
                        f"folder {folder_id!r} cannot move under itself or its own subtree"
                    )
                if len(above) >= MAX_NODE_DEPTH:
                    raise InvalidInput(f"the knowledge base nests at most {MAX_NODE_DEPTH} deep")
            self._check_name(conn, bank_ref, parent, name, folder_id)
            now = now_iso()
            conn.execute(
                "UPDATE memory_knowledge_folders SET name = ?, parent_id = ?, updated_at = ?"
                " WHERE bank_ref = ? AND id = ?",
                (name, parent, now, bank_ref, folder_id),
            )
        folder.name, folder.parent_id, folder.updated_at = name, parent, now
        return folder

    def delete_knowledge_node(self, bank_ref: str, node_id: str) -> list[str] | None:
        if holds_nul(node_id):
            return None
        with self._bank_write(bank_ref) as conn:
            if _delete_model(conn, bank_ref, node_id, page_only=True):
                return [node_id]
            folders = {
                r["id"]: r["parent_id"]
                for r in conn.execute(
                    "SELECT id, parent_id FROM memory_knowledge_folders WHERE bank_ref = ?",
                    (bank_ref,),
                ).fetchall()
            }
            if node_id not in folders:
                return None
            subtree = {node_id}
            grew = True
            while grew:  # bounded by the bank's folder count
                grew = False
                for folder_id, parent in folders.items():
                    if parent in subtree and folder_id not in subtree:
                        subtree.add(folder_id)
                        grew = True
            pages = [
                r["id"]
                for r in conn.execute(
                    "SELECT id, parent_id FROM memory_mental_models WHERE bank_ref = ?"
                    " AND is_page = 1",
                    (bank_ref,),
                ).fetchall()
                if r["parent_id"] in subtree
            ]
            for page_id in pages:
                _delete_model(conn, bank_ref, page_id)
            for folder_id in subtree:
                conn.execute(
                    "DELETE FROM memory_knowledge_folders WHERE bank_ref = ? AND id = ?",
                    (bank_ref, folder_id),
                )
        return pages


def _delete_model(conn: Any, bank_ref: str, model_id: str, *, page_only: bool = False) -> bool:
    """Delete the bank's mental model *model_id* (``page_only``: only when it is a page of
    the knowledge base) on *conn*, in the caller's transaction; whether one was deleted."""
    page = " AND is_page = 1" if page_only else ""
    gone = conn.execute(
        f"DELETE FROM memory_mental_models WHERE bank_ref = ? AND id = ?{page} RETURNING id",
        (bank_ref, model_id),
    ).fetchall()
    return bool(gone)
