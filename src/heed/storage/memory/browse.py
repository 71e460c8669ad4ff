"""The memory store's reads for the views of a bank (:class:`heed.memory.store.BrowseStore`):
entities with their mention counts and co-occurrence, the links among units, the bank's tag
lists and its chunks.

Every statement is the same on SQLite and PostgreSQL; lists of any length go through the
dialect's :meth:`~.dialect.MemoryDialect.any_of_many`. A tag filter is the store's
``_tags_clause`` (recall's rule applied to the distinct tag lists, never restated in SQL).
A unit's time here is its ``mentioned_at``, else its ``created_at``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

from heed.memory.models import TagsMatch
from heed.memory.store import UnitFilter
from heed.memory.tags import filters_by_tags
from heed.memory.views.rows import ChunkRow, EntityCount, EntityEdge, TagListCount, UnitLink
from heed.storage.database import SqlDatabase
from heed.storage.memory.dialect import MemoryDialect
from heed.storage.memory.rows import holds_nul, loads, row_limit, without_nul

__all__ = ["BrowseReads"]

#: A unit's time in these views (``memory_units u``).
_UNIT_TIME: Final = "COALESCE(u.mentioned_at, u.created_at)"
#: Where :meth:`BrowseReads.tag_lists` reads each source's tag lists.
_TAG_SOURCES: Final = frozenset({"memories", "mental_models"})


class BrowseReads:
    """The read half of the views (see the module docstring): part of
    :class:`~heed.storage.memory.store.SqlMemoryStore`, which sets its database and its
    database's part and gives ``_tags_clause``."""

    db: SqlDatabase
    dialect: MemoryDialect
    _tags_clause: Callable[..., tuple[str, tuple[Any, ...]] | None]

    def _tagged_units(
        self, conn: Any, bank_ref: str, tags: Sequence[str] | None, match: TagsMatch
    ) -> tuple[str, tuple[Any, ...]] | None:
        """SQL keeping the units ``u`` passing the tag filter, and its parameters: ``""``
        when the filter keeps every unit, ``None`` when it keeps none."""
        if not filters_by_tags(tags, match):
            return "", ()
        tagged = self._tags_clause(
            conn, "bank_ref = ?", [bank_ref], UnitFilter(tags=tags, tags_match=match)
        )
        if tagged is None:
            return None
        return (
            f" AND u.seq IN (SELECT seq FROM memory_units WHERE bank_ref = ? AND {tagged[0]})",
            (bank_ref, *tagged[1]),
        )

    def entity_counts(
        self,
        bank_ref: str,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
        limit: int,
        offset: int,
        *,
        entity_id: str | None = None,
        min_count: int = 1,
    ) -> tuple[list[EntityCount], int]:
        """See :meth:`heed.memory.store.BrowseStore.entity_counts`."""
        if holds_nul(entity_id, *(tags or ())):
            return [], 0
        with self.db.read() as conn:
            tagged = self._tagged_units(conn, bank_ref, tags, tags_match)
            if tagged is None:
                return [], 0
            where = "e.bank_ref = ? AND u.bank_ref = ?" + tagged[0]
            params: list[Any] = [bank_ref, bank_ref, *tagged[1]]
            if entity_id is not None:
                where += " AND e.id = ?"
                params.append(entity_id)
            grouped = (
                "FROM memory_entities e JOIN memory_unit_entities ue ON ue.entity_id = e.id"
                f" JOIN memory_units u ON u.seq = ue.unit_seq WHERE {where}"
                " GROUP BY e.id, e.name, e.canonical, e.type HAVING COUNT(*) >= ?"
            )
            params.append(max(1, min_count))
            total = conn.execute(
                f"SELECT COUNT(*) FROM (SELECT e.id {grouped}) AS c", params
            ).fetchone()[0]
            rows = conn.execute(
                f"SELECT e.id, e.name, e.type, COUNT(*) AS n, MIN({_UNIT_TIME}) AS first_seen,"
                f" MAX({_UNIT_TIME}) AS last_seen {grouped}"
                " ORDER BY n DESC, e.canonical LIMIT ? OFFSET ?",
                (*params, row_limit(limit), max(0, offset)),
            ).fetchall()
        return [
            EntityCount(
                id=str(r["id"]),
                name=str(r["name"]),
                type=r["type"],
                mention_count=int(r["n"]),
                first_seen=r["first_seen"],
                last_seen=r["last_seen"],
            )
            for r in rows
        ], int(total)

    def entity_edges(
        self,
        bank_ref: str,
        entity_ids: Sequence[str],
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
    ) -> list[EntityEdge]:
        """See :meth:`heed.memory.store.BrowseStore.entity_edges`."""
        ids = without_nul(entity_ids)
        if len(ids) < 2 or holds_nul(*(tags or ())):
            return []
        with self.db.read() as conn:
            tagged = self._tagged_units(conn, bank_ref, tags, tags_match)
            if tagged is None:
                return []
            source, source_params = self.dialect.any_of_many("a.entity_id", ids, "text")
            target, target_params = self.dialect.any_of_many("b.entity_id", ids, "text")
            rows = conn.execute(
                "SELECT a.entity_id AS s, b.entity_id AS t, COUNT(*) AS n,"
                f" MAX({_UNIT_TIME}) AS last FROM memory_unit_entities a"
                " JOIN memory_unit_entities b"
                " ON b.unit_seq = a.unit_seq AND a.entity_id < b.entity_id"
                " JOIN memory_units u ON u.seq = a.unit_seq"
                f" WHERE u.bank_ref = ? AND {source} AND {target}{tagged[0]}"
                " GROUP BY a.entity_id, b.entity_id ORDER BY n DESC, s, t",
                (bank_ref, *source_params, *target_params, *tagged[1]),
            ).fetchall()
        return [
            EntityEdge(
                source=str(r["s"]),
                target=str(r["t"]),
                weight=int(r["n"]),
                last_cooccurred=r["last"],
            )
            for r in rows
        ]

    def unit_links(self, bank_ref: str, unit_ids: Sequence[str]) -> list[UnitLink]:
        """See :meth:`heed.memory.store.BrowseStore.unit_links`."""
        ids = without_nul(unit_ids)
        if len(ids) < 2:
            return []
        source, source_params = self.dialect.any_of_many("f.id", ids, "text")
        target, target_params = self.dialect.any_of_many("t.id", ids, "text")
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT f.id AS s, t.id AS t, l.link_type, l.weight FROM memory_links l"
                " JOIN memory_units f ON f.seq = l.from_seq JOIN memory_units t ON t.seq = l.to_seq"
                f" WHERE f.bank_ref = ? AND t.bank_ref = ? AND {source} AND {target}",
                (bank_ref, bank_ref, *source_params, *target_params),
            ).fetchall()
        links: dict[tuple[str, str, str], float] = {}
        for r in rows:
            a, b = sorted((str(r["s"]), str(r["t"])))
            key = (a, b, str(r["link_type"]))
            links[key] = max(links.get(key, 0.0), float(r["weight"]))
        return [UnitLink(a, b, kind, weight) for (a, b, kind), weight in sorted(links.items())]

    def tag_lists(
        self, bank_ref: str, source: str, fact_type: str | None = None
    ) -> list[TagListCount]:
        """See :meth:`heed.memory.store.BrowseStore.tag_lists`."""
        if source not in _TAG_SOURCES:
            raise ValueError(f"tags are read from memories or mental_models, not {source!r}")
        if holds_nul(fact_type):
            return []
        counts: Counter[tuple[str, ...]] = Counter()
        with self.db.read() as conn:
            if source == "mental_models":
                for tags, n in conn.execute(
                    "SELECT tags, COUNT(*) FROM memory_mental_models WHERE bank_ref = ?"
                    " GROUP BY tags",
                    (bank_ref,),
                ).fetchall():
                    counts[tuple(loads(tags) or ())] += int(n)
                return [TagListCount(tags, n) for tags, n in counts.items()]
            where, params = "bank_ref = ?", [bank_ref]
            if fact_type is not None:
                where += " AND fact_type = ?"
                params.append(fact_type)
            refs: dict[str, int] = {}
            for tags, ref, n in conn.execute(
                f"SELECT tags, tags_ref, COUNT(*) FROM memory_units WHERE {where}"
                " GROUP BY tags, tags_ref",
                params,
            ).fetchall():
                if ref is None:
                    counts[tuple(loads(tags) or ())] += int(n)
                else:
                    refs[str(ref)] = refs.get(str(ref), 0) + int(n)
            if refs:
                match, match_params = self.dialect.any_of_many("digest", list(refs), "text")
                for digest, body in conn.execute(
                    f"SELECT digest, body FROM memory_values WHERE bank_ref = ? AND {match}",
                    (bank_ref, *match_params),
                ).fetchall():
                    counts[tuple(loads(body) or ())] += refs[str(digest)]
        return [TagListCount(tags, n) for tags, n in counts.items()]

    def document_chunks(
        self, bank_ref: str, document_id: str, limit: int, offset: int
    ) -> tuple[list[ChunkRow], int] | None:
        """See :meth:`heed.memory.store.BrowseStore.document_chunks`."""
        if holds_nul(document_id):
            return None
        with self.db.read() as conn:
            document = conn.execute(
                "SELECT d.created_at, b.bank_id FROM memory_documents d"
                " JOIN memory_banks b ON b.ref = d.bank_ref"
                " WHERE d.bank_ref = ? AND d.document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if document is None:
                return None
            total = conn.execute(
                "SELECT COUNT(*) FROM memory_chunks WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()[0]
            rows = conn.execute(
                "SELECT id, chunk_index, text FROM memory_chunks"
                " WHERE bank_ref = ? AND document_id = ? ORDER BY chunk_index, id"
                " LIMIT ? OFFSET ?",
                (bank_ref, document_id, row_limit(limit), max(0, offset)),
            ).fetchall()
        return [
            ChunkRow(
                id=str(r["id"]),
                bank_id=str(document["bank_id"]),
                document_id=document_id,
                chunk_index=int(r["chunk_index"]),
                text=str(r["text"]),
                created_at=str(document["created_at"]),
            )
            for r in rows
        ], int(total)

    def find_chunk(self, tenant: str, chunk_id: str) -> ChunkRow | None:
        """See :meth:`heed.memory.store.BrowseStore.find_chunk`."""
        if holds_nul(tenant, chunk_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT c.id, c.document_id, c.chunk_index, c.text, b.bank_id, d.created_at"
                " FROM memory_chunks c JOIN memory_banks b ON b.ref = c.bank_ref"
                " LEFT JOIN memory_documents d"
                " ON d.bank_ref = c.bank_ref AND d.document_id = c.document_id"
                " WHERE b.tenant = ? AND c.id = ?",
                (tenant, chunk_id),
            ).fetchone()
        if row is None:
            return None
        return ChunkRow(
            id=str(row["id"]),
            bank_id=str(row["bank_id"]),
            document_id=str(row["document_id"]),
            chunk_index=int(row["chunk_index"]),
            text=str(row["text"]),
            created_at=str(row["created_at"] or ""),
        )
