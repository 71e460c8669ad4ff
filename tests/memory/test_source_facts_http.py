"""Recall's ``include.source_facts`` budgets over a real server (both databases): the facts
the returned observations rest on, within ``max_tokens`` in all and
``max_tokens_per_observation`` each (-1: no limit); and retain items' Hindsight options heed
does not implement, refused by name."""

from __future__ import annotations

from typing import Any

import httpx

from tests.memory.test_curation_http import FACTS, observed_bank, server, url
from tests.support import LiveServer

__all__ = ["server"]  # the fixture, shared


def recall(server: LiveServer, bank: str, source_facts: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        url(server, bank, "/memories/recall"),
        json={
            "query": "Ivy Porto bakery Mara",
            "types": ["observation"],
            "include": {"source_facts": source_facts},
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_source_facts_follow_their_budgets(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    everything = recall(server, bank, {"max_tokens_per_observation": -1})
    assert set(everything["source_facts"]) == set(ids.values())
    # One fact each: the observation on facts 0 and 1 brings only its first.
    first_only = recall(server, bank, {"max_tokens_per_observation": 12})
    texts = {f["text"] for f in first_only["source_facts"].values()}
    assert len(texts) < len(FACTS) and texts, texts
    assert recall(server, bank, {"max_tokens": 1})["source_facts"] == {}


def test_retain_item_options_heed_does_not_implement_are_refused(server: LiveServer) -> None:
    bank, _ = observed_bank(server)
    for name, value in (("strategy", "fast"), ("observation_scopes", "shared")):
        response = httpx.post(
            url(server, bank, "/memories"),
            json={"items": [{"content": "Ivy sings.", name: value}]},
            timeout=30,
        )
        assert response.status_code == 400 and f"items[0].{name}" in response.text
    ok = httpx.post(
        url(server, bank, "/memories"),
        json={"items": [{"content": "Ivy sings.", "resolve_entities": False}]},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text
