"""How recall weighs what its stages found: the ranking's tunable weights, and the two
query-side rules that use a query's entity names.

The ranking of a recall's candidates (:mod:`heed.memory.recall.pipeline`, stages
``rerank`` and ``boost``):

- ``rerank`` (the ``blend`` reranker): ``semantic * cosine + (1 - semantic) * bm25 /
  best_bm25``, the cosine taken with the query embedded **without its entity names**
  (:func:`heed.memory.recall.query.semantic_text`): a name is matched by the keyword
  arm, the entity arm and the speaker boost below; in the query's embedding it pulled in
  every unit that addresses the person ("Thanks, John!") rather than what the question
  asks about. On LoCoMo the vector arm alone (its own top 20 in ``trace``) went from
  recall@10 0.511 to 0.610.
- ``boost``: ``speaker`` is added to a unit whose speaker (a dialogue turn's ``Name:``
  label: :func:`heed.memory.retain.units.speaker_of`) is one of the query's entities: a question
  about a person is answered mostly by what that person said (on the LoCoMo dev split,
  950 of the 972 evidence turns of questions naming one speaker are that speaker's), and
  ``temporal`` to a unit whose event time (its ``occurred_*`` range) or mention time (its
  ``mentioned_at``) falls in the query's date window (:mod:`heed.memory.dates`, relative
  dates resolved against the query's ``query_timestamp``, else now).

The weights are bank settings (``recall_semantic_weight``, ``recall_speaker_weight``,
``recall_temporal_weight``: :mod:`heed.memory.bank_config.settings`), so a bank can be tuned and the
LoCoMo benchmark chooses them per fold on held-out conversations. Their defaults
(:data:`DEFAULT_WEIGHTS`) are the values ``benchmarks/locomo_recall.py`` chose on all five
dev conversations; they encode no date, name or phrase of any data.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from heed.memory.entities import canonical

if TYPE_CHECKING:
    from heed.memory.bank_config.view import BankSettings

__all__ = [
    "DEFAULT_WEIGHTS",
    "MAX_BOOST",
    "WEIGHT_SETTINGS",
    "RankingWeights",
    "ranking_weights",
    "speaks",
]

#: The largest boost a bank may set (a boost past the scores' range only reorders less).
MAX_BOOST: Final = 10.0


@dataclass(frozen=True, slots=True)
class RankingWeights:
    """The ranking's weights (see the module docstring)."""

    #: Share of the cosine in the blend (the rest is the normalised BM25), in [0, 1].
    semantic: float = 0.6
    #: Added to a unit spoken by one of the query's entities.
    speaker: float = 0.2
    #: Added to a unit whose event or mention time is in the query's date window.
    temporal: float = 0.2


DEFAULT_WEIGHTS: Final = RankingWeights()

#: Bank setting -> (field of :class:`RankingWeights`, lowest, highest).
WEIGHT_SETTINGS: Final[Mapping[str, tuple[str, float, float]]] = {
    "recall_semantic_weight": ("semantic", 0.0, 1.0),
    "recall_speaker_weight": ("speaker", 0.0, MAX_BOOST),
    "recall_temporal_weight": ("temporal", 0.0, MAX_BOOST),
}


def ranking_weights(settings: BankSettings) -> RankingWeights:
    """The weights a bank whose settings are *settings* ranks with (a weight it does not
    set, or set to a value out of its bounds, is the default: the view's rule)."""
    return RankingWeights(
        **{field: float(getattr(settings, name)) for name, (field, _, _) in WEIGHT_SETTINGS.items()}
    )


def speaks(speaker: str | None, entity_names: Collection[str]) -> bool:
    """Whether *speaker* (a unit's, or ``None``) is one of the canonical *entity_names*."""
    return speaker is not None and canonical(speaker) in entity_names
