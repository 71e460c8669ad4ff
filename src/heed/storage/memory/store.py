"""The memory store: :class:`heed.memory.store.MemoryStore` written once over
:class:`~heed.storage.database.SqlDatabase`.

Every statement here is the same on SQLite and PostgreSQL; what differs (the keyword index,
vectors, seqs, list parameters) is the database's :class:`~.dialect.MemoryDialect`, picked
by the database's dialect: :class:`~.sqlite.SqliteMemory` or :class:`~.postgres.PostgresMemory`.
Documents and units are written and removed by :class:`~.writes.DocumentWrites`. Recall's
reads run through :meth:`SqlDatabase.cancellable`, so a cancelled token stops a running
statement on either database. The contracts (tie order, limits, NUL) are the protocol's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from heed.memory.models import Bank, BankStats, DocumentInfo, StoredUnit
from heed.memory.store import BankGone, UnitFilter, VectorChanges, VectorRows
from heed.memory.tags import filters_by_tags, tags_pass
from heed.memory.views.timeseries import TIME_FIELDS
from heed.storage.database import SqlDatabase, apply_migrations, read_page
from heed.storage.memory.aliases import AliasRows
from heed.storage.memory.browse import BrowseReads
from heed.storage.memory.curation import CurationWrites
from heed.storage.memory.dialect import memory_dialect
from heed.storage.memory.directives import DirectiveWrites
from heed.storage.memory.rows import (
    DOCUMENT_VALUES,
    UNIT_COLUMNS,
    bank_from_row,
    document_from_row,
    holds_nul,
    insert_bank,
    loads,
    now_iso,
    read_generation,
    refuse_nul_in_bank,
    row_limit,
    unit_from_row,
    without_nul,
)
from heed.storage.memory.schema import DEFAULT_DIM, memory_migrations
from heed.storage.mental_models import MentalModelWrites
from heed.storage.transfer.rows import TransferRows

__all__ = ["SqlMemoryStore"]

#: The columns ``list_units`` may order and filter by time.
_TIME_COLUMNS: Final = frozenset(
    {"mentioned_at", "occurred_start", "occurred_end", "created_at", "updated_at"}
)


def _like(search: str) -> str:
    """A ``LIKE ... ESCAPE '\\'`` pattern finding *search* anywhere, case-folded (``%`` and
    ``_`` in it stay wildcards, as they always were)."""
    return "%" + search.lower().replace("\\", "\\\\") + "%"


class SqlMemoryStore(
    CurationWrites, AliasRows, TransferRows, DirectiveWrites, MentalModelWrites, BrowseReads
):
    """Banks, documents, units, entities, links and the keyword index of every tenant, on
    either database (see the module docstring and :class:`heed.memory.store.MemoryStore`);
    its writes come from :class:`~.writes.DocumentWrites`, consolidation's from
    :class:`~.learning.LearningWrites`, curation's from :class:`~.curation.CurationWrites`
    and directives' from
    :class:`~.directives.DirectiveWrites`.

    *dim* is the size of the vectors the store holds (the embedder's): a unit with another
    size is refused, and on PostgreSQL it sizes the vector column.
    """

    def __init__(self, database: SqlDatabase, dim: int = DEFAULT_DIM) -> None:
        if dim < 1:
            raise ValueError(f"embedding dimension must be positive, got {dim}")
        self.db = database
        self.dim = dim
        self.dialect = memory_dialect(database, dim)
        #: Whether recall searches vectors here (PostgreSQL) rather than in process.
        self.searches_vectors = self.dialect.searches_vectors

    def migrate(self) -> None:
        """Apply the memory component's migrations, then check the schema fits this store
        (on PostgreSQL: :class:`~heed.storage.memory.postgres.SchemaMismatch` when the
        stored vectors have another size or pgvector is older than 0.8)."""
        apply_migrations(self.db, memory_migrations(self.dim))
        self.dialect.check_schema()

    # -- banks -----------------------------------------------------------------------------

    def get_bank(self, tenant: str, bank_id: str) -> Bank | None:
        """The bank whose id is *bank_id*, else the one it is an alias of
        (:mod:`heed.memory.aliases`): an alias costs a second read only on a miss."""
        if holds_nul(tenant, bank_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT * FROM memory_banks WHERE tenant = ? AND bank_id = ?", (tenant, bank_id)
            ).fetchone()
            if row is None:
                return self.bank_by_alias(conn, tenant, bank_id)
        return bank_from_row(row)

    def list_banks(
        self, tenant: str, limit: int, offset: int, search: str | None = None
    ) -> tuple[list[tuple[Bank, int]], int]:
        if holds_nul(tenant) or holds_nul(search or ""):
            return [], 0
        where = "tenant = ?"
        params: tuple[Any, ...] = (tenant,)
        if search:
            pattern = (
                "%"
                + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                + "%"
            )
            where += (
                " AND (LOWER(bank_id) LIKE ? ESCAPE '\\' OR LOWER(name) LIKE ? ESCAPE '\\'"
                " OR EXISTS (SELECT 1 FROM memory_bank_aliases a WHERE a.bank_ref = b.ref"
                " AND LOWER(a.alias) LIKE ? ESCAPE '\\'))"
            )
            params += (pattern, pattern, pattern)
        rows, total = read_page(
            self.db,
            "b.*, (SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = b.ref) AS n",
            f"memory_banks b WHERE {where}",
            params,
            "bank_id",
            row_limit(limit),
            max(0, offset),
        )
        return [(bank_from_row(r), int(r["n"])) for r in rows], total

    def save_bank(self, bank: Bank) -> Bank:
        refuse_nul_in_bank(bank)
        now = now_iso()
        profile = (
            bank.name,
            bank.mission,
            bank.background,
            json.dumps(bank.disposition),
            json.dumps(bank.config),
        )
        with self.db.write() as conn:
            row = conn.execute(
                f"SELECT created_at FROM memory_banks WHERE ref = ?{self.db.for_update}",
                (bank.ref,),
            ).fetchone()
            if row is None:
                if bank.created_at:
                    raise BankGone(bank.ref)  # read as existing, deleted since
                insert_bank(conn, bank, (bank.ref, bank.tenant, bank.bank_id, *profile, now, now))
                bank.created_at = bank.updated_at = now
            else:
                bank.updated_at = now
                bank.created_at = row["created_at"]
                conn.execute(
                    "UPDATE memory_banks SET name = ?, mission = ?, background = ?,"
                    " disposition = ?, config = ?, updated_at = ? WHERE ref = ?",
                    (*profile, now, bank.ref),
                )
        return bank

    def bank_stats(self, bank_ref: str) -> BankStats:
        with self.db.read() as conn:
            by_type = _counts(
                conn,
                "SELECT fact_type, COUNT(*) FROM memory_units WHERE bank_ref = ?"
                " GROUP BY fact_type",
                (bank_ref,),
            )
            links = _counts(
                conn,
                "SELECT l.link_type, COUNT(*) FROM memory_links l JOIN memory_units u"
                " ON u.seq = l.from_seq WHERE u.bank_ref = ? GROUP BY l.link_type",
                (bank_ref,),
            )
            documents = conn.execute(
                "SELECT COUNT(*) FROM memory_documents WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
            last = conn.execute(
                "SELECT last_write_at FROM memory_banks WHERE ref = ?", (bank_ref,)
            ).fetchone()
        return BankStats(
            units_by_type=by_type,
            links_by_type=links,
            documents=int(documents),
            last_write_at=last[0] if last else None,
        )

    def units_per_time_prefix(
        self, bank_ref: str, *, time_field: str, chars: int, since: str
    ) -> list[tuple[str, str, int]]:
        if time_field not in TIME_FIELDS:
            raise ValueError(f"not a unit time column: {time_field!r}")
        when = time_field if time_field == "created_at" else f"COALESCE({time_field}, created_at)"
        bucket = f"SUBSTR({when}, 1, {int(chars)})"
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {bucket}, fact_type, COUNT(*) FROM memory_units"
                f" WHERE bank_ref = ? AND {bucket} >= ? GROUP BY {bucket}, fact_type",
                (bank_ref, since),
            ).fetchall()
        return [(str(prefix), str(fact_type), int(n)) for prefix, fact_type, n in rows]

    # -- recall ----------------------------------------------------------------------------

    def bank_generation(self, bank_ref: str) -> int | None:
        with self.db.read() as conn:
            return read_generation(conn, bank_ref)

    def load_vectors(self, bank_ref: str) -> VectorRows:
        with self.db.cancellable() as conn:
            generation = read_generation(conn, bank_ref) or 0  # first: see VectorRows
            return self.dialect.vector_rows(conn, bank_ref, generation, None)

    def vectors_since(self, bank_ref: str, generation: int) -> VectorChanges | None:
        with self.db.cancellable() as conn:
            now = read_generation(conn, bank_ref)
            if now is None:
                return None
            rows = self.dialect.vector_rows(conn, bank_ref, now, generation)
            count = conn.execute(
                "SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
        return VectorChanges(rows, int(count))

    def unit_seqs(self, bank_ref: str) -> np.ndarray:
        with self.db.cancellable() as conn:
            rows = conn.execute(
                "SELECT seq FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchall()
        return np.asarray([int(r[0]) for r in rows], dtype=np.int64)

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        if k <= 0 or (types is not None and not types):
            return []
        if np.size(query) != self.dim:
            raise ValueError(
                f"the query vector has {np.size(query)} dimensions; the store holds {self.dim}"
            )
        return self.dialect.vector_search(bank_ref, query, k, types)

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        return self.dialect.unit_vectors(bank_ref, seqs) if seqs else {}

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        words = [t for t in dict.fromkeys(without_nul(terms)) if t.strip()]
        if not words or limit == 0:
            return []
        return self.dialect.keyword_search(bank_ref, words, row_limit(limit))

    def units_by_entities(
        self, bank_ref: str, canonical_names: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        names = without_nul(canonical_names)
        if not names:
            return []
        match, params = self.dialect.any_of("e.canonical", names, "text")
        with self.db.cancellable() as conn:
            rows = conn.execute(
                "SELECT ue.unit_seq, COUNT(*) AS hits FROM memory_entities e"
                " JOIN memory_unit_entities ue ON ue.entity_id = e.id"
                f" WHERE e.bank_ref = ? AND {match}"
                " GROUP BY ue.unit_seq ORDER BY hits DESC, ue.unit_seq DESC LIMIT ?",
                (bank_ref, *params, row_limit(limit)),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def linked_units(
        self, bank_ref: str, seqs: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        if not seqs:
            return []
        match, params = self.dialect.any_of("from_seq", [int(s) for s in seqs], "bigint")
        with self.db.cancellable() as conn:
            rows = conn.execute(
                f"SELECT to_seq, SUM(weight) AS w FROM memory_links WHERE {match}"
                " GROUP BY to_seq ORDER BY w DESC, to_seq DESC LIMIT ?",
                (*params, row_limit(limit)),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def units_in_window(
        self, bank_ref: str, start: str, end: str, limit: int
    ) -> list[tuple[int, str]]:
        if holds_nul(start, end):
            return []
        with self.db.cancellable() as conn:
            rows = conn.execute(
                "SELECT seq, occurred_start FROM memory_units WHERE bank_ref = ?"
                " AND occurred_start <= ? AND COALESCE(occurred_end, occurred_start) >= ?"
                " ORDER BY occurred_start DESC, seq DESC LIMIT ?",
                (bank_ref, end, start, row_limit(limit)),
            ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def _units(self, conn: Any, where: str, params: Iterable[Any]) -> list[StoredUnit]:
        """The units of ``WHERE`` *where*, each with its entities' names (in entity id
        order)."""
        rows = conn.execute(
            f"SELECT {UNIT_COLUMNS} FROM memory_units WHERE {where}", tuple(params)
        ).fetchall()
        units = [unit_from_row(r) for r in rows]
        if units:
            by_seq = {u.seq: u for u in units}
            match, seq_params = self.dialect.any_of("ue.unit_seq", list(by_seq), "bigint")
            for seq, name in conn.execute(
                "SELECT ue.unit_seq, e.name FROM memory_unit_entities ue"
                f" JOIN memory_entities e ON e.id = ue.entity_id WHERE {match}"
                " ORDER BY ue.unit_seq, ue.entity_id",
                seq_params,
            ).fetchall():
                by_seq[int(seq)].entities.append(str(name))
        return units

    def fetch_units(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, StoredUnit]:
        out: dict[int, StoredUnit] = {}
        wanted = [int(s) for s in seqs]
        step = self.dialect.list_max
        with self.db.cancellable() as conn:
            for start in range(0, len(wanted), step):
                match, params = self.dialect.any_of("seq", wanted[start : start + step], "bigint")
                for unit in self._units(conn, f"bank_ref = ? AND {match}", (bank_ref, *params)):
                    out[unit.seq] = unit
        return out

    def fetch_chunks(self, bank_ref: str, chunk_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        ids = without_nul(chunk_ids)
        if not ids:
            return {}
        match, params = self.dialect.any_of("id", ids, "text")
        with self.db.cancellable() as conn:
            rows = conn.execute(
                f"SELECT id, chunk_index, text FROM memory_chunks WHERE bank_ref = ? AND {match}",
                (bank_ref, *params),
            ).fetchall()
        return {
            r["id"]: {"id": r["id"], "chunk_index": r["chunk_index"], "text": r["text"]}
            for r in rows
        }

    def entity_states(
        self, bank_ref: str, canonical_names: Sequence[str], per_entity: int
    ) -> dict[str, dict[str, Any]]:
        names = list(dict.fromkeys(without_nul(canonical_names)))
        if not names:
            return {}
        with self.db.cancellable() as conn:
            rows = _observations(conn, bank_ref, names, row_limit(per_entity))
        out: dict[str, dict[str, Any]] = {}
        for _canonical, entity_id, name, unit_seq, text, mentioned_at in rows:
            state = out.setdefault(
                name, {"entity_id": entity_id, "canonical_name": name, "observations": []}
            )
            if unit_seq is not None:
                state["observations"].append({"text": text, "mentioned_at": mentioned_at})
        return out

    # -- memories and documents ------------------------------------------------------------

    def list_units(
        self, bank_ref: str, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]:
        if holds_nul(
            flt.fact_type,
            flt.document_id,
            flt.search,
            flt.entity_id,
            flt.chunk_id,
            flt.start,
            flt.end,
            flt.consolidation_state,
            *(flt.tags or ()),
        ):
            return [], 0
        where = ["bank_ref = ?"]
        params: list[Any] = [bank_ref]
        # Each condition applies when its value is given (not empty).
        conditions: list[tuple[str, str | None]] = [
            ("fact_type = ?", flt.fact_type),
            ("document_id = ?", flt.document_id),
            ("consolidation_state = ?", flt.consolidation_state),
            ("LOWER(text) LIKE ? ESCAPE '\\'", _like(flt.search) if flt.search else None),
            (
                "seq IN (SELECT unit_seq FROM memory_unit_entities WHERE entity_id = ?)",
                flt.entity_id,
            ),
            ("chunk_id = ?", flt.chunk_id),
        ]
        for condition, value in conditions:
            if value:
                where.append(condition)
                params.append(value)
        order = "seq DESC"
        if flt.time_field:
            if flt.time_field not in _TIME_COLUMNS:
                raise ValueError(f"units are not ordered by {flt.time_field!r}")
            column = flt.time_field
            where.append(f"{column} IS NOT NULL")
            if flt.start:
                where.append(f"{column} >= ?")
                params.append(flt.start)
            if flt.end:
                where.append(f"{column} < ?")
                params.append(flt.end)
            order = f"{column} DESC, seq DESC"
        with self.db.read() as conn:
            if filters_by_tags(flt.tags, flt.tags_match):
                tagged = self._tags_clause(conn, " AND ".join(where), params, flt)
                if tagged is None:
                    return [], 0
                where.append(tagged[0])
                params.extend(tagged[1])
            clause = " AND ".join(where)
            total = conn.execute(
                f"SELECT COUNT(*) FROM memory_units WHERE {clause}", params
            ).fetchone()[0]
            units = self._units(
                conn,
                f"{clause} ORDER BY {order} LIMIT ? OFFSET ?",
                (*params, row_limit(limit), max(0, offset)),
            )
        return units, int(total)

    def _tags_clause(
        self, conn: Any, clause: str, params: list[Any], flt: UnitFilter
    ) -> tuple[str, tuple[Any, ...]] | None:
        """SQL keeping the units of *clause* whose tags pass *flt*'s tag filter, and its
        parameters; ``None`` when none do.

        The rule is :func:`heed.memory.tags.tags_pass`, applied here to each distinct tag
        list the units hold (usually few: the units of one item share its tags),
        never restated in SQL: the units kept are those holding a passing list, inline
        (``tags``) or shared (``tags_ref``, :mod:`.values`)."""
        wanted, match = flt.tags, flt.tags_match
        inline = [
            str(row[0])
            for row in conn.execute(
                f"SELECT DISTINCT tags FROM memory_units WHERE {clause} AND tags_ref IS NULL",
                params,
            ).fetchall()
            if tags_pass(loads(row[0]) or (), wanted, match)
        ]
        shared = [
            str(row[0])
            for row in conn.execute(
                "SELECT v.digest, v.body FROM memory_values v WHERE v.bank_ref = ? AND v.digest"
                f" IN (SELECT tags_ref FROM memory_units WHERE {clause} AND tags_ref IS NOT NULL)",
                (params[0], *params),
            ).fetchall()
            if tags_pass(loads(row[1]) or (), wanted, match)
        ]
        parts: list[str] = []
        values: list[Any] = []
        if inline:
            sql, more = self.dialect.any_of_many("tags", inline, "text")
            parts.append(f"(tags_ref IS NULL AND {sql})")
            values.extend(more)
        if shared:
            sql, more = self.dialect.any_of_many("tags_ref", shared, "text")
            parts.append(sql)
            values.extend(more)
        return (f"({' OR '.join(parts)})", tuple(values)) if parts else None

    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        if holds_nul(unit_id):
            return None
        with self.db.read() as conn:
            units = self._units(conn, "bank_ref = ? AND id = ?", (bank_ref, unit_id))
        return units[0] if units else None

    def list_documents(
        self, bank_ref: str, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]:
        if holds_nul(search):
            return [], 0
        where = "d.bank_ref = ?"
        params: list[Any] = [bank_ref]
        if search:
            where += (
                " AND (LOWER(d.document_id) LIKE ? ESCAPE '\\'"
                " OR LOWER(d.original_text) LIKE ? ESCAPE '\\')"
            )
            params += [_like(search)] * 2
        rows, total = read_page(
            self.db,
            f"d.*, {DOCUMENT_VALUES}, {_UNIT_COUNT}",
            f"memory_documents d WHERE {where}",
            params,
            "d.updated_at DESC, d.document_id",
            row_limit(limit),
            max(0, offset),
        )
        return [document_from_row(r, False) for r in rows], total

    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None:
        if holds_nul(document_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES}, {_UNIT_COUNT} FROM memory_documents d"
                " WHERE d.bank_ref = ? AND d.document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if row is None:
                return None
            info = document_from_row(row, True)
            info.units_by_type = _counts(
                conn,
                "SELECT fact_type, COUNT(*) FROM memory_units"
                " WHERE bank_ref = ? AND document_id = ? GROUP BY fact_type",
                (bank_ref, document_id),
            )
        return info


#: Entities whose observations one statement reads (SQLite allows 500 compound terms).
_ENTITIES_PER_STATEMENT: Final = 100


def _observations_sql(entities: int) -> str:
    """The bank's entities among *entities* canonical names, with their latest units'
    text and ``mentioned_at`` (``canonical, id, name, unit_seq, text, mentioned_at``), one
    row per unit, newest first (an entity without units: one row, ``unit_seq`` ``NULL``).

    Parameters: per entity ``bank_ref, canonical, limit``, then ``bank_ref`` and the
    canonical names again. A ``UNION`` of one index range per entity: any limit, and an
    entity named in a million units costs as little as one named in three (a recall names
    few entities; a write's links read a fixed few seqs of many entities otherwise, in
    :mod:`~heed.storage.memory.writes`).
    """
    latest = " UNION ALL ".join(
        "SELECT * FROM (SELECT ue.entity_id, ue.unit_seq, u.text, u.mentioned_at"
        " FROM memory_unit_entities ue JOIN memory_units u ON u.seq = ue.unit_seq"
        " WHERE ue.entity_id ="
        " (SELECT x.id FROM memory_entities x WHERE x.bank_ref = ? AND x.canonical = ?)"
        f" ORDER BY ue.unit_seq DESC LIMIT ?) AS f{i}"
        for i in range(entities)
    )
    return (
        "SELECT e.canonical, e.id, e.name, f.unit_seq, f.text, f.mentioned_at"
        f" FROM memory_entities e LEFT JOIN ({latest}) AS f ON f.entity_id = e.id"
        f" WHERE e.bank_ref = ? AND e.canonical IN ({','.join('?' * entities)})"
        " ORDER BY e.canonical, f.unit_seq DESC"
    )


def _observations(conn: Any, bank_ref: str, canonicals: Sequence[str], limit: int) -> list[Any]:
    """The rows of :func:`_observations_sql` for *canonicals*."""
    rows: list[Any] = []
    for start in range(0, len(canonicals), _ENTITIES_PER_STATEMENT):
        part = list(canonicals[start : start + _ENTITIES_PER_STATEMENT])
        params = [p for name in part for p in (bank_ref, name, limit)]
        sql = _observations_sql(len(part))
        rows.extend(conn.execute(sql, (*params, bank_ref, *part)).fetchall())
    return rows


def _counts(conn: Any, sql: str, params: Sequence[Any]) -> dict[str, int]:
    """The rows of a ``SELECT key, COUNT(*) ... GROUP BY key`` as a mapping."""
    return {str(r[0]): int(r[1]) for r in conn.execute(sql, params).fetchall()}


#: A document row's unit count (``memory_documents d``), as ``n``.
_UNIT_COUNT: Final = (
    "(SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = d.bank_ref"
    " AND u.document_id = d.document_id) AS n"
)
