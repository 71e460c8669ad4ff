"""Query analysis, done once per recall: keyword terms, entity names, a date window."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from heed.memory.dates import find_dates
from heed.memory.embeddings import TokenCounter
from heed.memory.entities import query_entity_names
from heed.memory.models import InvalidInput, RecallQuery, refuse_nul

__all__ = [
    "STOP_WORDS",
    "QueryAnalysis",
    "analyze_query",
    "check_query",
    "keyword_terms",
    "semantic_text",
]

_STOP_TEXT = """
    a about above after again against all am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further had hadn't has hasn't have haven't having he he'd
    he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
    is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only
    or other ought our ours ourselves out over own same shan't she she'd she'll she's should
    shouldn't so some such than that that's the their theirs them themselves then there there's
    these they they'd they'll they're they've this those through to too under until up very was
    wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while
    who who's whom why why's with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves s t d ll m re ve also just will shall may might must us get got go went kind
    sort thing things one ones does did done say said tell told like would
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def keyword_terms(text: str, limit: int = 32) -> list[str]:
    """Lower-cased words of *text* without stop words, deduplicated, in order."""
    terms: list[str] = []
    for word in _WORD.findall(text.lower()):
        word = word.split("'")[0]
        if len(word) < 2 or word in STOP_WORDS or word in terms:
            continue
        terms.append(word)
        if len(terms) >= limit:
            break
    return terms


def semantic_text(query: str, entity_names: Iterable[str]) -> str:
    """*query* without its entity names (case-insensitive, whole words, with a possessive
    ``'s``), spaces collapsed: what the query is embedded as. When nothing but stop words
    would be left ("Caroline?", "Tell me about Rome"), the query itself."""
    names = sorted({n for n in entity_names if n}, key=len, reverse=True)
    if not names:
        return query
    pattern = re.compile(
        r"(?<!\w)(?:"
        + "|".join(r"\s+".join(map(re.escape, name.split())) for name in names)
        + r")(?:['\u2019]s)?(?!\w)",
        re.IGNORECASE,
    )
    stripped = " ".join(pattern.sub(" ", query).split())
    return stripped if keyword_terms(stripped) else query


@dataclass(frozen=True, slots=True)
class QueryAnalysis:
    """What the arms need from the query text."""

    terms: list[str]
    entity_names: list[str]
    window: tuple[datetime, datetime] | None
    #: What the query is embedded as (:func:`semantic_text`).
    semantic_query: str


def analyze_query(
    query: str, anchor: datetime | None, window: tuple[datetime, datetime] | None = None
) -> QueryAnalysis:
    """Terms for BM25, canonical entity names, the query's date window (explicit wins; a
    relative date resolved against *anchor*) and the text to embed."""
    if window is None:
        dates = find_dates(query, anchor)
        if dates:
            window = (min(d.start for d in dates), max(d.end for d in dates))
    names = query_entity_names(query)
    return QueryAnalysis(keyword_terms(query), names, window, semantic_text(query, names))


def check_query(query: RecallQuery, max_query_tokens: int, tokens: TokenCounter) -> None:
    """Refuse empty, wordless and over-long (over *max_query_tokens*) queries, and NUL in the
    query or its tags, with an :class:`InvalidInput` naming the problem."""
    refuse_nul(query.query, "query")
    for i, tag in enumerate(query.tags or ()):
        refuse_nul(tag, f"tags[{i}]")
    text = query.query.strip()
    if not text:
        raise InvalidInput("query is empty")
    if not any(ch.isalnum() for ch in text):
        raise InvalidInput("query has no words (only punctuation or symbols)")
    if len(text.encode()) <= max_query_tokens:
        return  # a token covers at least one byte (WordPiece: a character): cannot be over
    n = tokens.count(text)
    if n > max_query_tokens:
        raise InvalidInput(f"query has {n} tokens; the limit is {max_query_tokens}")
