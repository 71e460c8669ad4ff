"""Provenance of a recall's observations: the facts they rest on.

A recall that returns observations may drop the raw facts they rest on
(``prefer_observations``) and return those facts beside them (``include_source_facts``),
within a token budget. Applied after the pipeline ranked the hits
(:meth:`heed.memory.engine.MemoryEngine.recall`).
"""

from __future__ import annotations

from heed.memory.bank_config.view import BankSettings
from heed.memory.models import Bank, RecallHit, RecallOutcome, RecallQuery, StoredUnit
from heed.memory.store import MemoryStore
from heed.runtime import run_in_thread

__all__ = ["with_provenance"]


async def with_provenance(
    store: MemoryStore,
    bank: Bank,
    query: RecallQuery,
    outcome: RecallOutcome,
    settings: BankSettings,
) -> RecallOutcome:
    """Apply ``prefer_observations`` (the query's, else the bank's
    ``recall_prefer_observations``: a raw fact a returned observation rests on is
    dropped) and fill ``source_facts`` (the returned observations' facts, within
    ``max_source_facts_tokens``)."""
    cited = list(
        dict.fromkeys(
            i for h in outcome.hits if h.unit.fact_type == "observation" for i in h.unit.source_ids
        )
    )
    if not cited:
        return outcome
    prefer = query.prefer_observations
    if settings.recall_prefer_observations if prefer is None else prefer:
        drop = set(cited)
        outcome.hits = [h for h in outcome.hits if h.unit.id not in drop]
    if query.include_source_facts:
        units = await run_in_thread(store.units_by_ids, bank.ref, cited)
        outcome.source_facts = _source_facts(outcome.hits, units, query)
    return outcome


def _source_facts(
    hits: list[RecallHit], units: list[StoredUnit], query: RecallQuery
) -> dict[str, RecallHit]:
    """The facts the returned observations rest on, observation by observation in rank
    order, within ``max_source_facts_tokens`` in all and, when set,
    ``max_source_facts_tokens_per_observation`` each (a fact counts once, for the first
    observation citing it)."""
    by_id = {unit.id: unit for unit in units}
    facts: dict[str, RecallHit] = {}
    budget = query.max_source_facts_tokens
    for hit in hits:
        if hit.unit.fact_type != "observation":
            continue
        own = query.max_source_facts_tokens_per_observation
        for source in hit.unit.source_ids:
            unit = by_id.get(source)
            if unit is None or unit.id in facts:
                continue
            cost = unit.token_count or max(1, len(unit.text) // 4)
            if cost > budget:
                return facts
            if own is not None and cost > own:
                break
            budget -= cost
            if own is not None:
                own -= cost
            facts[unit.id] = RecallHit(unit=unit, final=0.0)
    return facts
