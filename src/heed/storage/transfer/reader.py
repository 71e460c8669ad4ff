"""A bank read as rows for a transfer, from one consistent snapshot.

:class:`SnapshotReader` is the :class:`~heed.transfer.rows.BankReader` of
:meth:`heed.storage.transfer.rows.TransferRows.read_bank`, over a connection inside one
read-only snapshot (the database's own: :meth:`MemoryDialect.read_snapshot`). Every
section is read by keyset pages of at most the asked batch (documents by id, units by
document and seq, the others by unit seq), each page one statement on a cancellable
connection: a cancel stops a running statement and the next page never starts. Memory
holds one page. A unit's keyword text is what the index holds
(:attr:`MemoryDialect.unit_index_text`): on PostgreSQL, which keeps only a ``tsvector``,
it is ``None`` and the export rebuilds it (:mod:`heed.transfer.sections.units`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

import numpy as np

from heed.runtime import raise_if_cancelled
from heed.storage.database import from_row
from heed.storage.memory.dialect import MemoryDialect
from heed.storage.memory.rows import DOCUMENT_VALUES, UNIT_COLUMNS, unit_from_row
from heed.transfer.rows import (
    BankSelection,
    ChunkRow,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    UnitRow,
)

__all__ = ["SnapshotReader"]


#: The fields of :class:`UnitRow` a stored unit gives as it is (the rest: the index text and
#: the vector, read apart).
_STORED_FIELDS: Final = tuple(
    f.name for f in fields(UnitRow) if f.name not in ("index_text", "vector")
)


@dataclass(eq=False, slots=True)
class SnapshotReader:
    """A :class:`~heed.transfer.rows.BankReader` over an open snapshot *conn*: the rows of
    bank *bank_ref* that *selection* names, read in *dialect*."""

    conn: Any
    bank_ref: str
    selection: BankSelection
    dialect: MemoryDialect

    # -- the selection ---------------------------------------------------------------------

    def _units_where(self, table: str) -> tuple[str, tuple[Any, ...]]:
        """The selected units of the bank, as a condition on *table* (a name or alias)."""
        where = f"{table}.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        ids = self.selection.document_ids
        if ids is not None:
            match, more = self.dialect.any_of(f"{table}.document_id", list(ids), "text")
            where += f" AND {match}"
            params += more
        if not self.selection.with_observations:
            where += f" AND {table}.document_id IS NOT NULL"
        return where, params

    def count_units(self) -> int:
        where, params = self._units_where("memory_units")
        row = self.conn.execute(f"SELECT COUNT(*) FROM memory_units WHERE {where}", params)
        return int(row.fetchone()[0])

    # -- documents ---------------------------------------------------------------------------

    def documents(self, batch: int) -> Iterator[list[DocumentRow]]:
        where = "d.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        if self.selection.document_ids is not None:
            match, more = self.dialect.any_of(
                "d.document_id", list(self.selection.document_ids), "text"
            )
            where += f" AND {match}"
            params += more
        after = ""
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES},"
                " (SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = d.bank_ref"
                " AND u.document_id = d.document_id) AS n"
                f" FROM memory_documents d WHERE {where} AND d.document_id > ?"
                " ORDER BY d.document_id LIMIT ?",
                (*params, after, batch),
            ).fetchall()
            if not rows:
                return
            page = {
                r["document_id"]: from_row(
                    DocumentRow,
                    r,
                    metadata=json.loads(r["metadata_json"]),
                    tags=json.loads(r["tags_json"]),
                    unit_count=int(r["n"]),
                )
                for r in rows
            }
            match, ids = self.dialect.any_of("document_id", list(page), "text")
            for chunk in self.conn.execute(
                "SELECT id, document_id, chunk_index, text FROM memory_chunks"
                f" WHERE bank_ref = ? AND {match} ORDER BY document_id, chunk_index, id",
                (self.bank_ref, *ids),
            ).fetchall():
                page[chunk["document_id"]].chunks.append(
                    ChunkRow(chunk["id"], int(chunk["chunk_index"]), chunk["text"])
                )
            yield list(page.values())
            after = rows[-1]["document_id"]

    # -- units -------------------------------------------------------------------------------

    def _unit_page(self, where: str, params: Sequence[Any]) -> tuple[list[UnitRow], int]:
        """The units of ``SELECT seq FROM memory_units WHERE`` *where* (with its order and
        limit), in that order, with their keyword text (SQLite) and vectors. The page's
        seqs come first, by an index alone, and only its rows are read whole: selecting the
        whole rows with the order made SQLite build every row of the bank before sorting."""
        seqs = [
            int(r[0])
            for r in self.conn.execute(
                f"SELECT seq FROM memory_units WHERE {where}", tuple(params)
            ).fetchall()
        ]
        if not seqs:
            return [], 0
        index = self.dialect.unit_index_text
        match, seq_params = self.dialect.any_of("seq", seqs, "bigint")
        rows = {
            int(r["seq"]): r
            for r in self.conn.execute(
                f"SELECT {UNIT_COLUMNS}, {index} FROM memory_units WHERE {match}", seq_params
            ).fetchall()
        }
        vectors = self._vectors(seqs)
        out = []
        for seq in seqs:
            r = rows[seq]
            stored = unit_from_row(r)
            out.append(
                UnitRow(
                    **{name: getattr(stored, name) for name in _STORED_FIELDS},
                    index_text=r["index_text"],
                    vector=vectors.get(seq),
                )
            )
        return out, seqs[-1]

    def _vectors(self, seqs: list[int]) -> dict[int, np.ndarray]:
        match, params = self.dialect.any_of("seq", seqs, "bigint")
        sql = f"SELECT seq, embedding FROM memory_units WHERE {match} AND embedding IS NOT NULL"
        return self.dialect.snapshot_vectors(self.conn, sql, params)

    def units(self, batch: int) -> Iterator[list[UnitRow]]:
        where, params = self._units_where("memory_units")
        document, seq = "", 0
        while True:
            raise_if_cancelled()
            page, last = self._unit_page(
                f"{where} AND document_id IS NOT NULL AND (document_id, seq) > (?, ?)"
                " ORDER BY document_id, seq LIMIT ?",
                (*params, document, seq, batch),
            )
            if not page:
                return
            yield page
            document, seq = str(page[-1].document_id), last

    def observations(self, batch: int) -> Iterator[list[UnitRow]]:
        if not self.selection.with_observations:
            return
        seq = 0
        while True:
            raise_if_cancelled()
            page, last = self._unit_page(
                "bank_ref = ? AND document_id IS NULL AND seq > ? ORDER BY seq LIMIT ?",
                (self.bank_ref, seq, batch),
            )
            if not page:
                return
            yield page
            seq = last

    # -- entities and the graph ----------------------------------------------------------------

    def entities(self, batch: int) -> Iterator[list[EntityRow]]:
        where = "e.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        if not self.selection.whole_bank:
            units, more = self._units_where("u")
            where += (
                " AND EXISTS (SELECT 1 FROM memory_unit_entities ue JOIN memory_units u"
                f" ON u.seq = ue.unit_seq WHERE ue.entity_id = e.id AND {units})"
            )
            params += more
        after = ""
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT e.id, e.name, e.type FROM memory_entities e WHERE {where}"
                " AND e.id > ? ORDER BY e.id LIMIT ?",
                (*params, after, batch),
            ).fetchall()
            if not rows:
                return
            yield [EntityRow(r["id"], r["name"], r["type"]) for r in rows]
            after = rows[-1]["id"]

    def _unit_ids(self, batch: int) -> Iterator[dict[int, str]]:
        """The selected units' ``seq -> id``, by seq, in pages."""
        where, params = self._units_where("memory_units")
        seq = 0
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT seq, id FROM memory_units WHERE {where} AND seq > ? ORDER BY seq LIMIT ?",
                (*params, seq, batch),
            ).fetchall()
            if not rows:
                return
            yield {int(r[0]): str(r[1]) for r in rows}
            seq = int(rows[-1][0])

    def memberships(self, batch: int) -> Iterator[list[MembershipRow]]:
        for ids in self._unit_ids(batch):
            match, params = self.dialect.any_of("unit_seq", list(ids), "bigint")
            rows = self.conn.execute(
                f"SELECT unit_seq, entity_id FROM memory_unit_entities WHERE {match}"
                " ORDER BY unit_seq, entity_id",
                params,
            ).fetchall()
            if rows:
                yield [MembershipRow(ids[int(r[0])], str(r[1])) for r in rows]

    def links(self, batch: int) -> Iterator[list[LinkRow]]:
        targets, target_params = self._units_where("t")
        for ids in self._unit_ids(batch):
            match, params = self.dialect.any_of("l.from_seq", list(ids), "bigint")
            # CROSS JOIN: the links of the page first, then their targets by key (with a
            # plain join SQLite walked the whole bank's units for every page).
            rows = self.conn.execute(
                "SELECT l.from_seq, t.id, l.link_type, l.weight FROM memory_links l"
                f" CROSS JOIN memory_units t WHERE t.seq = l.to_seq AND {match} AND {targets}"
                " ORDER BY l.from_seq, l.to_seq, l.link_type",
                (*params, *target_params),
            ).fetchall()
            if rows:
                yield [LinkRow(ids[int(r[0])], str(r[1]), str(r[2]), float(r[3])) for r in rows]
