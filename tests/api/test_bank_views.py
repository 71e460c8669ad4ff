"""The bank views over a real server, on SQLite and PostgreSQL: entities (list, one, graph,
the deprecated regenerate), the memory graph, tags, observation scopes and chunks, with the
content each answers; then the same routes through the unmodified ``hindsight-client``'s
generated API (``EntitiesApi``, ``MemoryApi``, ``DocumentsApi``), whose models parse heed's
answers.

The bank holds four items, one unit each, whose entities and tags are known:

======  ==========================================  ====================  =================
item    text                                        entities              tags
======  ==========================================  ====================  =================
0       Alice has two cats named Tom and Jerry.     Alice, Tom, Jerry     user:alice
1       Alice works as a nurse in Lyon.             Alice, Lyon           user:alice, work
2       Bob skis with Alice in the Alps.            Bob, Alice, Alps      user:bob, sport
3       Bob went sailing to Brest.                  Bob, Brest            (none)
======  ==========================================  ====================  =================
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hindsight_client_api import ApiClient, Configuration
from hindsight_client_api.api.documents_api import DocumentsApi
from hindsight_client_api.api.entities_api import EntitiesApi
from hindsight_client_api.api.memory_api import MemoryApi
from hindsight_client_api.exceptions import ApiException, NotFoundException

from heed.api.app import create_app
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server

BANK = "views"
SCOPES_BANK = "views-scopes"
DOC = "notes/alice.txt"
ITEMS: list[tuple[str, list[str], list[str]]] = [
    ("Alice has two cats named Tom and Jerry.", ["Alice", "Tom", "Jerry"], ["user:alice"]),
    ("Alice works as a nurse in Lyon.", ["Alice", "Lyon"], ["user:alice", "work"]),
    ("Bob skis with Alice in the Alps.", ["Bob", "Alice", "Alps"], ["user:bob", "sport"]),
    ("Bob went sailing to Brest.", ["Bob", "Brest"], []),
]
ENTITIES = {"Alice", "Tom", "Jerry", "Lyon", "Bob", "Alps", "Brest"}


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("views"),
            database_url=url,
            llm_provider="scripted",
            llm_script=json.dumps({"token_delay": 0, "replies": []}),
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        _ok(c.put(f"/v1/default/banks/{BANK}", json={}))
        items = [
            {
                "content": text,
                "entities": [{"text": name} for name in names],
                "tags": tags,
                **({"document_id": DOC} if i == 0 else {}),
            }
            for i, (text, names, tags) in enumerate(ITEMS)
        ]
        retained = _ok(c.post(f"/v1/default/banks/{BANK}/memories", json={"items": items}))
        assert retained["units_count"] == len(ITEMS), retained
        yield c


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.url, response.text)
    return response.json()


def _get(client: httpx.Client, path: str, status: int = 200, **params: Any) -> Any:
    return _ok(client.get(f"/v1/default/banks/{BANK}{path}", params=params), status)


def _entity_id(client: httpx.Client, name: str) -> str:
    items = _get(client, "/entities", limit=1000)["items"]
    return str(next(e["id"] for e in items if e["canonical_name"] == name))


# -- entities ----------------------------------------------------------------------------------


def test_entities_are_listed_most_named_first_with_their_counts(client: httpx.Client) -> None:
    page = _get(client, "/entities")
    names = [e["canonical_name"] for e in page["items"]]
    assert set(names) >= ENTITIES
    assert page["total"] == len(names) and (page["limit"], page["offset"]) == (100, 0)
    counts = {e["canonical_name"]: e["mention_count"] for e in page["items"]}
    assert (counts["Alice"], counts["Bob"], counts["Tom"], counts["Brest"]) == (3, 2, 1, 1)
    assert names[:2] == ["Alice", "Bob"]
    assert all(e["first_seen"] and e["first_seen"] <= e["last_seen"] for e in page["items"])
    second = _get(client, "/entities", limit=1, offset=1)
    assert [e["canonical_name"] for e in second["items"]] == ["Bob"]
    assert second["total"] == page["total"]


def test_entities_count_only_the_memories_the_tags_keep(client: httpx.Client) -> None:
    strict = _get(client, "/entities", tags=["sport"], tags_match="any_strict")
    assert {e["canonical_name"]: e["mention_count"] for e in strict["items"]} == {
        "Alice": 1,
        "Bob": 1,
        "Alps": 1,
    }
    # ``any`` keeps the untagged item too: Brest and Bob's second mention come back
    loose = _get(client, "/entities", tags=["sport"])
    counts = {e["canonical_name"]: e["mention_count"] for e in loose["items"]}
    assert counts["Bob"] == 2 and counts["Brest"] == 1 and "Tom" not in counts
    exact = _get(client, "/entities", tags=["user:alice", "work"], tags_match="exact")
    assert {e["canonical_name"] for e in exact["items"]} == {"Alice", "Lyon"}


def test_one_entity_with_its_latest_memories(client: httpx.Client) -> None:
    alice = _entity_id(client, "Alice")
    detail = _get(client, f"/entities/{alice}")
    assert (detail["id"], detail["canonical_name"], detail["mention_count"]) == (alice, "Alice", 3)
    assert {o["text"] for o in detail["observations"]} == {t for t, n, _ in ITEMS if "Alice" in n}
    assert all(o["mentioned_at"] for o in detail["observations"])
    tagged = _get(client, f"/entities/{alice}", tags=["work"], tags_match="any_strict")
    assert [o["text"] for o in tagged["observations"]] == [ITEMS[1][0]]
    assert tagged["mention_count"] == 1
    # an entity no kept memory names is a 404
    tom = _entity_id(client, "Tom")
    gone = _get(client, f"/entities/{tom}", 404, tags=["sport"], tags_match="any_strict")
    assert tom in gone["detail"]
    # the deprecated regenerate answers the entity as it is
    regenerated = _ok(client.post(f"/v1/default/banks/{BANK}/entities/{alice}/regenerate"))
    assert regenerated == detail


def test_unknown_entity_bank_and_bad_filters_are_refused_by_name(client: httpx.Client) -> None:
    assert "'no-such-entity'" in _get(client, "/entities/no-such-entity", 404)["detail"]
    assert (
        "regenerate"
        not in _ok(
            client.post(f"/v1/default/banks/{BANK}/entities/no-such-entity/regenerate"), 404
        )["detail"]
    )
    missing = _ok(client.get("/v1/default/banks/no-such-bank/entities"), 404)
    assert "'no-such-bank'" in missing["detail"]
    assert "tags_match" in _get(client, "/entities", 400, tags_match="some")["detail"]
    assert "tag_groups" in _get(client, "/entities", 400, tag_groups="[]")["detail"]
    assert "tag_groups" in _get(client, "/entities/graph", 400, tag_groups="[]")["detail"]
    invalid = _get(client, "/entities", 422, limit=0)
    assert invalid["detail"][0]["loc"] == ["query", "limit"]
    invalid = _get(client, "/entities/graph", 422, min_count="x")
    assert invalid["detail"][0]["loc"] == ["query", "min_count"]


def test_entity_graph_links_entities_named_together(client: httpx.Client) -> None:
    graph = _get(client, "/entities/graph", limit=2)
    assert [n["data"]["label"] for n in graph["nodes"]] == ["Alice", "Bob"]
    assert [n["data"]["mentionCount"] for n in graph["nodes"]] == [3, 2]
    alice, bob = (n["data"]["id"] for n in graph["nodes"])
    assert len(graph["edges"]) == 1 and graph["total_edges"] == 1
    edge = graph["edges"][0]["data"]
    assert {edge["source"], edge["target"]} == {alice, bob}
    assert edge["weight"] == 1 and edge["linkType"] == "cooccurrence"
    assert edge["id"] == f"{edge['source']}-{edge['target']}" and edge["lastCooccurred"]
    assert graph["total_entities"] == len(ENTITIES) and graph["limit"] == 2
    everything = _get(client, "/entities/graph")
    weights = {
        frozenset((e["data"]["source"], e["data"]["target"])): e["data"]["weight"]
        for e in everything["edges"]
    }
    # pairs: item 0 three, item 1 one, item 2 three, item 3 one
    assert len(weights) == 8 and set(weights.values()) == {1}
    only_alice = _get(client, "/entities/graph", min_count=3)
    assert [n["data"]["label"] for n in only_alice["nodes"]] == ["Alice"]
    assert only_alice["edges"] == [] and only_alice["total_entities"] == 1


# -- the memory graph, tags, scopes --------------------------------------------------------------


def test_memory_graph_shows_units_and_the_links_among_them(client: httpx.Client) -> None:
    graph = _get(client, "/graph")
    texts = {n["data"]["text"] for n in graph["nodes"]}
    assert texts == {t for t, _, _ in ITEMS} and graph["total_units"] == len(ITEMS)
    assert {r["text"] for r in graph["table_rows"]} == texts
    by_text = {n["data"]["text"]: n["data"] for n in graph["nodes"]}
    assert set(by_text[ITEMS[0][0]]["entities"].split(", ")) == {"Alice", "Tom", "Jerry"}
    ids = {t: by_text[t]["id"] for t in texts}
    entity_edges = {
        (frozenset((e["data"]["source"], e["data"]["target"])), e["data"]["entityName"])
        for e in graph["edges"]
        if e["data"]["linkType"] == "entity"
    }
    assert (frozenset((ids[ITEMS[0][0]], ids[ITEMS[1][0]])), "Alice") in entity_edges
    assert (frozenset((ids[ITEMS[2][0]], ids[ITEMS[3][0]])), "Bob") in entity_edges
    assert all(e["data"]["source"] < e["data"]["target"] for e in graph["edges"])
    assert set(ids.values()) >= {e["data"]["source"] for e in graph["edges"]}
    one = _get(client, "/graph", document_id=DOC)
    assert [n["data"]["text"] for n in one["nodes"]] == [ITEMS[0][0]] and one["edges"] == []
    row = one["table_rows"][0]
    assert row["document_id"] == DOC and row["tags"] == ["user:alice"] and row["chunk_id"]
    by_chunk = _get(client, "/graph", chunk_id=row["chunk_id"])
    assert [n["data"]["id"] for n in by_chunk["nodes"]] == [row["id"]]
    found = _get(client, "/graph", q="SAILING")
    assert [n["data"]["text"] for n in found["nodes"]] == [ITEMS[3][0]]
    limited = _get(client, "/graph", limit=2)
    assert len(limited["nodes"]) == 2 and limited["total_units"] == len(ITEMS)
    assert _get(client, "/graph", type="observation")["nodes"] == []


def test_tags_with_counts_filtered_and_paged(client: httpx.Client) -> None:
    tags = _get(client, "/tags")
    assert tags["items"] == [
        {"tag": "user:alice", "count": 2},
        {"tag": "sport", "count": 1},
        {"tag": "user:bob", "count": 1},
        {"tag": "work", "count": 1},
    ]
    assert tags["total"] == 4
    users = _get(client, "/tags", q="USER:*")
    assert [t["tag"] for t in users["items"]] == ["user:alice", "user:bob"]
    assert [t["tag"] for t in _get(client, "/tags", q="*:b*")["items"]] == ["user:bob"]
    assert [t["tag"] for t in _get(client, "/tags", q="or")["items"]] == ["sport", "work"]
    page = _get(client, "/tags", limit=1, offset=1)
    assert page["items"] == [{"tag": "sport", "count": 1}] and page["total"] == 4
    assert _get(client, "/tags", source="mental_models") == {
        "items": [],
        "total": 0,
        "limit": 100,
        "offset": 0,
    }
    assert "source" in _get(client, "/tags", 400, source="documents")["detail"]


def test_tags_of_mental_models(client: httpx.Client) -> None:
    bank = "views-models"
    _ok(client.put(f"/v1/default/banks/{bank}", json={}))
    for tags in (["team:x"], ["team:x", "q3"]):
        body = {"name": "m", "source_query": "Who?", "tags": tags}
        _ok(client.post(f"/v1/default/banks/{bank}/mental-models", json=body))
    got = _ok(client.get(f"/v1/default/banks/{bank}/tags", params={"source": "mental_models"}))
    assert got["items"] == [{"tag": "team:x", "count": 2}, {"tag": "q3", "count": 1}]
    assert _ok(client.get(f"/v1/default/banks/{bank}/tags"))["items"] == []


def test_observation_scopes_are_the_observations_tag_sets(client: httpx.Client) -> None:
    bank = f"/v1/default/banks/{SCOPES_BANK}"
    _ok(client.put(bank, json={}))
    observations = [["user:alice"], ["user:alice"], ["b", "a"], []]
    items = [
        {"content": f"Observation {i} about the team.", "fact_type": "observation", "tags": tags}
        for i, tags in enumerate(observations)
    ]
    items.append({"content": "A world fact, not an observation.", "tags": ["world-only"]})
    _ok(client.post(f"{bank}/memories", json={"items": items}))
    scopes = _ok(client.get(f"{bank}/observations/scopes"))
    assert scopes["scopes"] == [
        {"tags": ["user:alice"], "count": 2},
        {"tags": [], "count": 1},
        {"tags": ["a", "b"], "count": 1},
    ]
    assert scopes["total"] == 3
    page = _ok(client.get(f"{bank}/observations/scopes", params={"limit": 1, "offset": 2}))
    assert page["scopes"] == [{"tags": ["a", "b"], "count": 1}] and page["total"] == 3
    assert _get(client, "/observations/scopes")["scopes"] == []


# -- chunks --------------------------------------------------------------------------------------


def test_chunks_of_a_document_and_by_id(client: httpx.Client) -> None:
    for path in (DOC, quote(DOC, safe="")):  # the id's slash sent as is and escaped
        listed = _get(client, f"/documents/{path}/chunks")
        assert [c["chunk_text"] for c in listed["items"]] == [ITEMS[0][0]]
        assert listed["total"] == 1 and (listed["limit"], listed["offset"]) == (100, 0)
    chunk = listed["items"][0]
    assert (chunk["bank_id"], chunk["document_id"], chunk["chunk_index"]) == (BANK, DOC, 0)
    one = _ok(client.get(f"/v1/default/chunks/{chunk['chunk_id']}"))
    assert one == chunk and one["created_at"] and one["attachments"] == []
    assert _get(client, f"/documents/{quote(DOC, safe='')}/chunks", offset=1)["items"] == []
    assert "'nope'" in _get(client, "/documents/nope/chunks", 404)["detail"]
    assert "'no-chunk'" in _ok(client.get("/v1/default/chunks/no-chunk"), 404)["detail"]
    assert _get(client, "/documents/x/chunks", 422, limit=1001)["detail"][0]["loc"] == [
        "query",
        "limit",
    ]
    # the document itself is still served at its own path
    assert _get(client, f"/documents/{DOC}")["original_text"] == ITEMS[0][0]


# -- through hindsight-client ------------------------------------------------------------------


def test_through_the_hindsight_client(server: LiveServer, client: httpx.Client) -> None:
    """The generated API of ``hindsight-client`` 1.1.0, unmodified, parses every answer."""

    async def drive() -> None:
        async with ApiClient(Configuration(host=server.url)) as api:
            entities, memory, documents = EntitiesApi(api), MemoryApi(api), DocumentsApi(api)
            listed = await entities.list_entities(BANK, limit=2)
            assert [(e.canonical_name, e.mention_count) for e in listed.items] == [
                ("Alice", 3),
                ("Bob", 2),
            ]
            assert listed.total == len(ENTITIES) and listed.limit == 2
            strict = await entities.list_entities(BANK, tags=["work"], tags_match="all_strict")
            assert {e.canonical_name for e in strict.items} == {"Alice", "Lyon"}
            alice = listed.items[0].id
            detail = await entities.get_entity(BANK, alice)
            assert detail.canonical_name == "Alice" and len(detail.observations) == 3
            assert ITEMS[2][0] in {o.text for o in detail.observations}
            with pytest.warns(DeprecationWarning):  # the client's own word
                again = await entities.regenerate_entity_observations(BANK, alice)
            assert again.to_dict() == detail.to_dict()
            with pytest.raises(NotFoundException):
                await entities.get_entity(BANK, "no-such-entity")
            graph = await entities.get_entity_graph(BANK, limit=2, min_count=2)
            assert [n.data.label for n in graph.nodes] == ["Alice", "Bob"]
            assert [(e.data.weight, e.data.link_type) for e in graph.edges] == [(1, "cooccurrence")]

            tags = await memory.list_tags(BANK, q="user:*")
            assert [(t.tag, t.count) for t in tags.items] == [("user:alice", 2), ("user:bob", 1)]
            assert tags.total == 2
            memories = await memory.get_graph(BANK, document_id=DOC)
            assert [r.text for r in memories.table_rows] == [ITEMS[0][0]]
            assert memories.nodes[0].data.text == ITEMS[0][0] and memories.total_units == 1
            full = await memory.get_graph(BANK, limit=10)
            assert {e.data.link_type for e in full.edges} >= {"entity"}
            assert "Alice" in {e.data.entity_name for e in full.edges}
            scopes = await memory.list_observation_scopes(SCOPES_BANK)
            assert (scopes.scopes[0].tags, scopes.scopes[0].count) == (["user:alice"], 2)

            chunks = await documents.list_document_chunks(BANK, DOC)
            assert [c.chunk_text for c in chunks.items] == [ITEMS[0][0]]
            with pytest.raises(ApiException) as refused:
                await documents.get_document_history(BANK, DOC)
            assert refused.value.status == 501 and "history" in str(refused.value.body)
            chunk = await documents.get_chunk(chunks.items[0].chunk_id)
            assert (chunk.bank_id, chunk.document_id, chunk.chunk_text) == (
                BANK,
                DOC,
                ITEMS[0][0],
            )

    # the scopes bank is made by the scopes test; make sure it exists when run alone
    if client.get(f"/v1/default/banks/{SCOPES_BANK}/observations/scopes").status_code == 404:
        test_observation_scopes_are_the_observations_tag_sets(client)
    asyncio.run(drive())


def test_document_history_is_a_501_naming_the_route_and_why(client: httpx.Client) -> None:
    answer = _get(client, f"/documents/{quote(DOC, safe='')}/history", 501)
    assert answer["detail"].startswith(
        "GET /v1/default/banks/{bank_id}/documents/{document_id}/history is not implemented"
    )
    assert "per-document change log" in answer["detail"]
    # the bank's and the document's 404s come first
    assert "'nope'" in _get(client, "/documents/nope/history", 404)["detail"]
    missing = client.get("/v1/default/banks/no-such-bank/documents/x/history")
    assert missing.status_code == 404


def test_long_tag_lists_stored_once_per_bank_are_counted_and_filtered(
    client: httpx.Client,
) -> None:
    """A tag list longer than a reference is stored once in ``memory_values`` (the rows hold
    its digest): tags, scopes and the entity filter read it all the same."""
    bank = "/v1/default/banks/views-long-tags"
    _ok(client.put(bank, json={}))
    long_tags = ["project:" + "x" * 80, "team:core"]
    items = [
        {"content": "Carol ships the release.", "tags": long_tags, "entities": [{"text": "Carol"}]},
        {"content": "Carol reviews the plan.", "tags": long_tags, "entities": [{"text": "Carol"}]},
        {"content": "Dan writes tests.", "tags": ["team:qa"], "entities": [{"text": "Dan"}]},
        {"content": "Carol sees a pattern.", "tags": long_tags, "fact_type": "observation"},
    ]
    _ok(client.post(f"{bank}/memories", json={"items": items}))
    tags = _ok(client.get(f"{bank}/tags"))["items"]
    assert tags == [
        {"tag": long_tags[0], "count": 3},
        {"tag": "team:core", "count": 3},
        {"tag": "team:qa", "count": 1},
    ]
    scopes = _ok(client.get(f"{bank}/observations/scopes"))["scopes"]
    assert scopes == [{"tags": sorted(long_tags), "count": 1}]
    core = _ok(
        client.get(f"{bank}/entities", params={"tags": "team:core", "tags_match": "any_strict"})
    )
    counts = {e["canonical_name"]: e["mention_count"] for e in core["items"]}
    assert counts["Carol"] >= 2 and "Dan" not in counts
