"""An archive written by heed on SQLite imports into heed on PostgreSQL and recalls the same
top results: two live servers, one per database, the unmodified hindsight-client exporting
from one and importing into the other. The vectors travel (nothing is embedded again) and
the keyword texts too (SQLite's FTS5 bodies become PostgreSQL's tsvectors), so the two
databases rank the same memories first; imported back into SQLite, the ranking is identical
to the source's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

CONVERSATION = [
    "Caroline: I adopted a beagle puppy named Rex last week.",
    "Melanie: That's lovely! Does he like the park?",
    "Caroline: He loves the park near my flat in Lyon, especially the pond.",
    "Melanie: I started learning the violin in March.",
    "Caroline: How are the lessons going?",
    "Melanie: My teacher says my bowing is improving, but scales are hard.",
    "Caroline: My brother Tom is moving to Montreal for a job at a bakery.",
    "Melanie: Montreal bagels are famous, he will be busy.",
    "Caroline: He starts in September and already bought winter boots.",
    "Melanie: We went kayaking on Lake Annecy on Sunday.",
    "Caroline: Was the water cold?",
    "Melanie: Freezing, but the mountains were worth it.",
]
NOTES = [
    "The quarterly budget review is scheduled for the second Tuesday of November.",
    "Server migrations to PostgreSQL need a maintenance window and a rollback plan.",
    "Sourdough bread needs a starter fed daily and a long cold proof.",
    "The library closes early on public holidays and opens late on Mondays.",
    "Tomatoes grow best with six hours of sun and deep, infrequent watering.",
]
QUERIES = [
    "What is Caroline's dog called?",
    "Where does Tom move for work?",
    "Which instrument is Melanie learning?",
    "kayaking on the lake",
    "how to bake sourdough bread",
    "when is the budget review",
    "watering tomatoes",
]
TOP = 5


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("across"), database_url=url, llm_provider="scripted"
        )

    with (
        fresh_schema() as url,
        live_server(create_app(settings(None))) as lite,
        live_server(create_app(settings(url))) as pg,
    ):
        yield lite, pg


def _top(client: Hindsight, bank: str, query: str) -> list[str]:
    return [r.text for r in client.recall(bank, query, budget="mid").results[:TOP]]


def _imported(server: LiveServer, client: Hindsight, archive: bytes, target: str) -> None:
    httpx.put(f"{server.url}/v1/default/banks/host", json={}, timeout=30).raise_for_status()
    operation_id = client.import_bank("host", archive, target_bank_id=target)

    def done() -> bool:
        status = httpx.get(
            f"{server.url}/v1/default/banks/host/operations/{operation_id}", timeout=30
        ).json()
        assert status["status"] not in ("failed", "cancelled"), status
        return bool(status["status"] == "completed")

    wait_for(done, seconds=120, interval=0.1)


def test_an_sqlite_archive_recalls_the_same_top_results_on_postgresql(
    servers: tuple[LiveServer, LiveServer],
) -> None:
    lite, pg = servers
    source = Hindsight(base_url=lite.url, timeout=60)
    target = Hindsight(base_url=pg.url, timeout=60)
    try:
        httpx.put(f"{lite.url}/v1/default/banks/origin", json={}, timeout=30).raise_for_status()
        source.retain("origin", "\n".join(CONVERSATION), document_id="chat", context="friends")
        source.retain_batch(
            "origin",
            [{"content": note, "document_id": f"note-{i}"} for i, note in enumerate(NOTES)],
        )
        archive = source.export_bank("origin", poll_interval=0.1)
        _imported(pg, target, archive, "moved")
        _imported(lite, source, archive, "copy")  # and back into SQLite, for reference

        assert httpx.get(f"{pg.url}/v1/default/banks/moved", timeout=30).status_code == 200
        stats = {
            name: httpx.get(f"{srv.url}/v1/default/banks/{bank}/stats", timeout=30).json()
            for name, srv, bank in (("lite", lite, "origin"), ("pg", pg, "moved"))
        }
        for key in ("total_nodes", "total_links", "total_documents", "nodes_by_fact_type"):
            assert stats["lite"][key] == stats["pg"][key], key

        for query in QUERIES:
            expected = _top(source, "origin", query)
            assert len(expected) == TOP, query
            assert _top(source, "copy", query) == expected, query  # same database: identical
            # Across databases the same memories come first: the best one, and the top five
            # as a set (below the first, the two keyword engines, FTS5's BM25 and heed's
            # BM25 over tsvectors without English stop words, may order near-ties
            # differently; the vectors and the texts indexed are the same).
            moved = _top(target, "moved", query)
            assert moved[0] == expected[0], (query, moved, expected)
            assert set(moved) == set(expected), (query, moved, expected)
    finally:
        source.close()
        target.close()
