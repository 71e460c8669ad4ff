"""A mental model's source fingerprint: a digest of everything its refresh would read.

A refresh (:mod:`heed.mental_models.refresh`) computes it before the LLM is asked and stores
it with the content it writes; a later refresh that computes the same fingerprint is
**skipped**: its run completes with ``{"skipped": "sources unchanged"}``, no LLM call is made
and the content and history stay as they are. The fingerprint is a SHA-256 over:

- the reflect request the refresh makes (:meth:`MentalModelRefreshes._request`): the
  model's ``source_query``, ``max_tokens``, tags and their ``tags_match``, and its trigger's
  ``budget``, ``fact_types`` and mental-model exclusions;
- the bank's settings that shape a reflect: every setting of
  :class:`heed.memory.bank_config.view.BankSettings` (mission, disposition, the recall
  settings, ...) except those that only shape other work (:data:`NOT_READ`), and the bank's
  ``background``;
- the directives that apply to the model's scope, as the prompt says them
  (:func:`heed.memory.directives.rules.rules_text`);
- the other mental models the reflect may consult (each one's id, name, question and
  content), unless the trigger excludes them;
- the reflect provider's kind and model;
- the **memories in the model's scope**: the count, seqs and generations of the bank's units
  that pass its tag filter and fact types
  (:meth:`heed.mental_models.store.MentalModelStore.scope_digest`).

**Why the scope and not the first recall.** A refresh is a reflect: its first recall (the
model's question) is fixed, but what it recalls next, and which memories it expands, the
LLM chooses by its tool calls. A digest of the first recall alone could miss a new memory
the LLM would have found by a second query. So the fingerprint covers every memory those
recalls could return: any unit entering or leaving the scope (a retain, a delete, a
consolidation writing an observation there) changes it, while writes outside the scope (other
tags, other fact types) do not. It is one aggregate query over the bank's units, no LLM and
no embedding. What it leaves out: the clock (recall weighs recency and dates against now),
the embedder and reranker a server runs, and an out-of-scope memory's entity links, which
may shift the ranking of in-scope memories a little; none of these alone makes a refresh ask
the LLM again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from heed.memory.directives.rules import DirectiveScope, rules_text
from heed.memory.directives.service import applicable_directives
from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank
from heed.mental_models.store import MentalModelStore
from heed.reflect import ReflectRequest
from heed.runtime import run_in_thread

__all__ = ["NOT_READ", "VERSION", "source_fingerprint"]

#: The recipe's version: a change of what is compared changes every fingerprint.
VERSION: Final = 1
#: Bank settings a refresh's reflect does not read (they shape retain, consolidation, the
#: refresh schedule or MCP): changing them does not make a refresh ask the LLM again.
NOT_READ: Final = frozenset(
    {
        "retain_mission",
        "retain_extraction_mode",
        "enable_observations",
        "observations_mission",
        "default_observation_scopes",
        "consolidation_strategies",
        "mental_model_min_refresh_interval_seconds",
        "mcp_enabled_tools",
    }
)


def _content_digest(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


async def source_fingerprint(
    engine: MemoryEngine,
    store: MentalModelStore,
    bank: Bank,
    model_id: str,
    request: ReflectRequest,
    provider: tuple[str, str],
) -> str:
    """The fingerprint of a refresh of the model *model_id* of *bank* that makes *request*
    with the reflect *provider* (``(kind, model)``); see the module docstring. Reads the
    store in the offload; no LLM call, no embedding."""
    settings = {
        name: value
        for name, value in engine.settings(bank).as_dict().items()
        if name not in NOT_READ
    }
    scope = DirectiveScope(request.tags, request.tags_match, request.apply_all_directives)
    rules = rules_text(await applicable_directives(engine, bank, scope))
    consulted: list[tuple[str, str]] = []
    if not request.exclude_mental_models:
        excluded = {model_id, *(request.exclude_mental_model_ids or ())}
        models = await run_in_thread(store.mental_models, bank.ref)
        consulted = [
            (m.id, _content_digest(m.name, m.source_query, m.content))
            for m in models
            if m.id not in excluded and m.content.strip()
        ]
    units = await run_in_thread(
        store.scope_digest, bank.ref, request.tags, request.tags_match, request.fact_types
    )
    parts: dict[str, Any] = {
        "version": VERSION,
        "request": {
            "query": request.query,
            "budget": request.budget,
            "context": request.context,
            "max_tokens": request.max_tokens,
            "tags": request.tags,
            "tags_match": request.tags_match,
            "apply_all_directives": request.apply_all_directives,
            "exclude_mental_models": request.exclude_mental_models,
            "exclude_mental_model_ids": request.exclude_mental_model_ids,
            "fact_types": request.fact_types,
        },
        "settings": settings,
        "background": bank.background,
        "directives": rules,
        "mental_models": sorted(consulted),
        "provider": list(provider),
        "units": units,
    }
    text = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
