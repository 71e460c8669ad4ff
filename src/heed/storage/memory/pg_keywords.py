"""BM25 keyword search on PostgreSQL: the ``keywords`` tsvector scored in one statement.

Each unit's ``keywords`` is written at insert from its index text (config ``english``:
stemming and stop words, like SQLite's porter tokenizer) plus a ``simple`` token naming
the bank, so the GIN index intersects a query with the bank's postings (SQLite's FTS5
``bank`` column does the same). :meth:`KeywordSearch.search` scores Okapi BM25 (k1 = 1.2,
b = 0.75, FTS5's idf floor of 1e-6) in one SQL statement: idf from the bank's unit count
and each term's matching units, term frequency from ``ts_rank`` of the term alone scaled
so that one occurrence counts 1 (exact for the usual single occurrence, saturating a
little faster above), document length from the lexeme count against the average over the
matching units. Scores are positive, higher is better: the convention of the SQLite part
(``-bm25()``), at about its scale, so the blend reranker (which divides by the best) and
``min_keyword`` read them alike. (FTS5 counts documents over all banks; here a bank's
statistics are its own.) Ties go to the newer unit (the larger seq), as on SQLite.

In a bank of more than :data:`KEYWORD_PRUNE_ABOVE_UNITS` units, words estimated (from the
planner's lexeme statistics) to match more than :data:`KEYWORD_CANDIDATES` units in all
are not all scored: the rarest words choose the candidates and every word scores them,
since a word matching much of a bank has a small idf and mostly reorders what the rare
ones find. Every statement runs through :meth:`PostgresDatabase.cancellable`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from heed.storage.memory.rows import bank_token
from heed.storage.postgres import PostgresDatabase

__all__ = ["KEYWORD_CANDIDATES", "KEYWORD_PRUNE_ABOVE_UNITS", "KeywordSearch"]

#: In a bank of more than this many units, a keyword search whose words are estimated to
#: match more than :data:`KEYWORD_CANDIDATES` units scores only the rarest words' matches.
#: (Chosen on a 1M-unit bank: docs/performance.md, "Memory".)
KEYWORD_PRUNE_ABOVE_UNITS: Final = 50_000
KEYWORD_CANDIDATES: Final = 2_000
#: How long the planner's lexeme statistics and a bank's unit count are reused (seconds).
STATS_SECONDS: Final = 60.0
_LEXEME: Final = re.compile(r"'((?:[^']|'')*)'")
#: BM25 parameters (those of SQLite's FTS5 ``bm25()``).
BM25_K1: Final = 1.2
BM25_B: Final = 0.75


@dataclass(frozen=True, slots=True)
class _KeywordPlan:
    """How :meth:`KeywordSearch.search` prunes a search of a large bank."""

    selective: set[str]
    estimates: dict[str, float]
    bank_size: int


class KeywordSearch:
    """BM25 over a bank's ``keywords`` (see the module docstring)."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.db = database
        #: See :data:`KEYWORD_PRUNE_ABOVE_UNITS` and :data:`KEYWORD_CANDIDATES`.
        self.prune_above_units = KEYWORD_PRUNE_ABOVE_UNITS
        self.candidates = KEYWORD_CANDIDATES
        self._lexemes: tuple[float, dict[str, float]] | None = None
        self._bank_sizes: dict[str, tuple[float, int]] = {}

    def search(self, bank_ref: str, terms: Sequence[str], limit: int) -> list[tuple[int, float]]:
        """BM25 over the bank's units matching any of *terms* (see the module docstring).

        Each term is parsed with ``plainto_tsquery`` (any text is safe: quotes and
        operators are only punctuation there); stop words drop out. In a large bank, when
        the terms are estimated to match more than :attr:`candidates` units, only the
        units matching the rarest of them are scored (:meth:`plan`).
        """
        words = list(dict.fromkeys(terms))
        plan = self.plan(bank_ref, words)
        if plan is not None:
            return self._pruned(bank_ref, words, plan, limit)
        with self.db.cancellable() as q:
            rows = q.execute(
                f"""
                WITH words AS (
                    SELECT DISTINCT plainto_tsquery('english', w) AS q
                    FROM unnest(?::text[]) AS w
                ), terms AS (
                    SELECT q, row_number() OVER () AS i FROM words WHERE numnode(q) > 0
                ), {_matched("terms")}
                ), {_HITS}
                ), df AS (
                    SELECT i, COUNT(*)::float8 AS n FROM hits GROUP BY i
                ), stats AS (
                    SELECT (SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?)::float8 AS n,
                        (SELECT AVG(dl) FROM matched) AS avgdl
                )
                {_SCORES}
                """,
                (words, bank_ref, bank_token(bank_ref), bank_ref, limit),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    # -- large banks ---------------------------------------------------------------------

    def _lexeme_frequencies(self) -> dict[str, float]:
        """The share of units holding each of the most common lexemes, from the planner's
        statistics of ``memory_units.keywords`` (``ANALYZE``); read again each minute."""
        cached = self._lexemes
        if cached is not None and time.monotonic() - cached[0] < STATS_SECONDS:
            return cached[1]
        with self.db.cancellable() as q:
            row = q.execute(
                "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats"
                " WHERE schemaname = current_schema() AND tablename = 'memory_units'"
                " AND attname = 'keywords'"
            ).fetchone()
        freqs = dict(zip(row[0], row[1], strict=False)) if row and row[0] else {}
        self._lexemes = (time.monotonic(), freqs)
        return freqs

    def _bank_size(self, bank_ref: str) -> int:
        """The bank's unit count, read again after :data:`STATS_SECONDS`."""
        cached = self._bank_sizes.get(bank_ref)
        if cached is not None and time.monotonic() - cached[0] < STATS_SECONDS:
            return cached[1]
        with self.db.cancellable() as q:
            row = q.execute(
                "SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()
        n = int(row[0])
        if len(self._bank_sizes) > 10_000:
            self._bank_sizes.clear()
        self._bank_sizes[bank_ref] = (time.monotonic(), n)
        return n

    def forget_sizes(self) -> None:
        """Read every bank's unit count again at its next search."""
        self._bank_sizes.clear()

    def plan(self, bank_ref: str, words: list[str]) -> _KeywordPlan | None:
        """Which words' matches to score, when scoring every match would be slow; ``None``
        for a bank of at most :attr:`prune_above_units` units, or words estimated to match
        at most :attr:`candidates` units.

        A word matching a large share of a bank has a small idf: it reorders the units the
        rare words find more than it finds units of its own. So the rarest words (in
        ascending estimated matches, while their sum stays within the bound; at least
        one) choose the candidates, every word scores them, and the common words' df is
        their estimate. The estimates are the planner's lexeme statistics (a word absent
        from them is rare); a bank without statistics yet is scored exactly.
        """
        freqs = self._lexeme_frequencies()
        if not freqs:
            return None
        size = self._bank_size(bank_ref)
        if size <= self.prune_above_units:
            return None
        with self.db.cancellable() as q:
            parsed = q.execute(
                "SELECT w, plainto_tsquery('english', w)::text FROM unnest(?::text[]) AS w",
                (words,),
            ).fetchall()
        estimates: dict[str, float] = {}
        for word, query in parsed:
            lexemes = [m.replace("''", "'") for m in _LEXEME.findall(query or "")]
            if lexemes:
                estimates[word] = min(float(freqs.get(x, 0.0)) for x in lexemes) * size
        bound = self.candidates
        if sum(estimates.values()) <= bound:
            return None
        chosen: set[str] = set()
        total = 0.0
        for word in sorted(estimates, key=estimates.__getitem__):
            if chosen and total + estimates[word] > bound:
                break
            chosen.add(word)
            total += estimates[word]
        return _KeywordPlan(selective=chosen, estimates=estimates, bank_size=size)

    def _pruned(
        self, bank_ref: str, words: list[str], plan: _KeywordPlan, limit: int
    ) -> list[tuple[int, float]]:
        """BM25 over the units matching the plan's selective words (at most
        :attr:`candidates` of them), every word counting in the score."""
        kept = [w for w in words if w in plan.estimates]
        with self.db.cancellable() as q:
            rows = q.execute(
                f"""
                WITH terms AS (
                    SELECT plainto_tsquery('english', w) AS q, sel, est,
                        row_number() OVER () AS i
                    FROM unnest(?::text[], ?::boolean[], ?::float8[]) AS x (w, sel, est)
                ), {_matched("terms WHERE sel")}
                    LIMIT {int(self.candidates)}
                ), {_HITS}
                ), df AS (
                    SELECT t.i, CASE WHEN t.sel THEN COUNT(h.seq)::float8
                        ELSE GREATEST(t.est, COUNT(h.seq)::float8) END AS n
                    FROM terms t LEFT JOIN hits h USING (i) GROUP BY t.i, t.sel, t.est
                ), stats AS (
                    SELECT ?::float8 AS n, (SELECT AVG(dl) FROM matched) AS avgdl
                )
                {_SCORES}
                """,
                (
                    kept,
                    [w in plan.selective for w in kept],
                    [plan.estimates[w] for w in kept],
                    bank_ref,
                    bank_token(bank_ref),
                    float(plan.bank_size),
                    limit,
                ),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]


def _matched(terms: str) -> str:
    """The CTE ``matched``: the bank's units matching any of *terms* (a ``FROM`` of
    ``terms``' rows; parameters: the bank's ref, then its token). Left open for a
    ``LIMIT``."""
    return f"""matched AS (
                    SELECT u.seq, u.keywords, length(u.keywords)::float8 AS dl
                    FROM memory_units u
                    WHERE u.bank_ref = ? AND u.keywords @@ (
                        plainto_tsquery('simple', ?)
                        && (SELECT string_agg('(' || q::text || ')', ' | ')::tsquery
                            FROM {terms})
                    )"""


#: The CTE ``hits``: each matched unit and term, with the term's frequency in the unit.
_HITS: Final = """hits AS (
                    SELECT m.seq, m.dl, t.i,
                        ts_rank(m.keywords, t.q)::float8
                        / ts_rank('x:1'::tsvector, 'x'::tsquery)::float8 AS tf
                    FROM matched m JOIN terms t ON m.keywords @@ t.q"""

#: Each unit's BM25 from ``hits``, ``df`` and ``stats``, best first, ties the newer unit
#: first (parameter: the limit).
_SCORES: Final = f"""SELECT h.seq, SUM(
                    GREATEST(LN((s.n - df.n + 0.5) / (df.n + 0.5)), 1e-6)
                    * h.tf * {BM25_K1 + 1}
                    / (h.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * h.dl / s.avgdl))
                ) AS score
                FROM hits h JOIN df USING (i) CROSS JOIN stats s
                GROUP BY h.seq ORDER BY score DESC, h.seq DESC LIMIT ?"""
