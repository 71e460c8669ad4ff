"""The memory store's transfer part (:class:`heed.memory.store.TransferStore`), on both
databases: a bank read from one snapshot, section by section in batches, and written back
row by row into another bank, which then answers every search like the first. Named here
for the contract check of ``test_memory_store.py`` (which reads every
``test_memory_*.py``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from heed.errors import InvalidText
from heed.memory.models import Bank
from heed.memory.store import BankGone, BankTaken, ObservationChanges, UnitFilter
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from heed.transfer.rows import BankSelection, DocumentRow, EntityRow, LinkRow, MembershipRow
from tests.storage.test_memory_store import DIM, _bank, _count, _doc, _unit, _vector


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _filled(store: SqlMemoryStore, bank_id: str = "src") -> Bank:
    """A bank with two documents (entities, links, long shared tags, a context) and two
    observations resting on their units."""
    bank = _bank(store, bank_id)
    first = [
        _unit("Alice: I adopted a cat named Tom", "Alice", "Tom", vector=_vector(1)),
        _unit("Bob: what colour is Tom?", "Bob", "Tom", vector=_vector(2)),
        _unit("Alice: Tom is grey", "Alice", "Tom", vector=_vector(3), tags=["x" * 90]),
    ]
    second = [
        _unit("Bob went sailing in Brest", "Bob", vector=_vector(4), context="c" * 100),
        _unit("Bob: the sea was rough", "Bob", vector=_vector(5), metadata={"k": "v"}),
    ]
    store.write_document(bank.ref, _doc(first, "doc-a"))
    store.write_document(bank.ref, _doc(second, "doc-b"))
    cat = _unit("Alice owns a grey cat", "Alice", vector=_vector(6), fact_type="observation")
    cat.source_ids = [first[0].id, first[2].id]
    cat.proof_count = 2
    cat.history = [{"text": "Alice owns a cat", "reason": "updated"}]
    sea = _unit("Bob sails", "Bob", vector=_vector(7), fact_type="observation")
    sea.source_ids = [second[0].id]
    store.write_observations(bank.ref, ObservationChanges(created=[cat, sea]))
    return bank


def _sections(store: SqlMemoryStore, bank: Bank, selection: BankSelection, batch: int = 2):  # type: ignore[no-untyped-def]
    with store.read_bank(bank.ref, selection) as reader:
        return {
            "count": reader.count_units(),
            "documents": [d for page in reader.documents(batch) for d in page],
            "units": [u for page in reader.units(batch) for u in page],
            "observations": [u for page in reader.observations(batch) for u in page],
            "entities": [e for page in reader.entities(batch) for e in page],
            "memberships": [m for page in reader.memberships(batch) for m in page],
            "links": [k for page in reader.links(batch) for k in page],
        }


def test_read_bank_gives_every_section_in_batches(store: SqlMemoryStore) -> None:
    bank = _filled(store)
    _filled(store, "other")  # another bank's rows never show
    got = _sections(store, bank, BankSelection())
    assert got["count"] == 7
    assert [d.document_id for d in got["documents"]] == ["doc-a", "doc-b"]
    assert [d.unit_count for d in got["documents"]] == [3, 2]
    assert [len(d.chunks) for d in got["documents"]] == [1, 1]
    assert got["documents"][0].metadata == {"source": "test"}
    assert got["documents"][0].tags == ["doc-tag"]
    texts = [u.text for u in got["units"]]
    assert texts == [
        "Alice: I adopted a cat named Tom",
        "Bob: what colour is Tom?",
        "Alice: Tom is grey",
        "Bob went sailing in Brest",
        "Bob: the sea was rough",
    ]
    assert [u.document_id for u in got["units"]] == ["doc-a"] * 3 + ["doc-b"] * 2
    grey = got["units"][2]
    assert grey.tags == ["x" * 90]  # a shared value, read back whole
    assert got["units"][3].context == "c" * 100 and got["units"][4].metadata == {"k": "v"}
    np.testing.assert_array_equal(got["units"][0].vector, _vector(1))
    if store.db.dialect == "sqlite":
        assert got["units"][0].index_text == "Alice: I adopted a cat named Tom"
    else:  # PostgreSQL keeps a tsvector, not the text: the reader rebuilds it
        assert got["units"][0].index_text is None
    observations = got["observations"]
    assert [o.text for o in observations] == ["Alice owns a grey cat", "Bob sails"]
    assert observations[0].source_ids == [got["units"][0].id, got["units"][2].id]
    assert observations[0].history == [{"text": "Alice owns a cat", "reason": "updated"}]
    assert observations[0].proof_count == 2 and observations[0].document_id is None
    names = sorted(e.name for e in got["entities"])
    assert names == ["Alice", "Bob", "Tom"]
    ids = {u.id for u in [*got["units"], *observations]}
    assert {m.unit_id for m in got["memberships"]} <= ids
    assert len(got["memberships"]) == 10
    assert got["links"] and all(k.from_id in ids and k.to_id in ids for k in got["links"])
    assert {k.link_type for k in got["links"]} == {"entity", "temporal"}


def test_read_bank_of_a_selection(store: SqlMemoryStore) -> None:
    bank = _filled(store)
    got = _sections(store, bank, BankSelection(document_ids=["doc-b", "missing"]))
    assert got["count"] == 2
    assert [d.document_id for d in got["documents"]] == ["doc-b"]
    assert [u.document_id for u in got["units"]] == ["doc-b", "doc-b"]
    assert got["observations"] == []
    assert [e.name for e in got["entities"]] == ["Bob"]  # only what its units name
    unit_ids = {u.id for u in got["units"]}
    assert all(k.from_id in unit_ids and k.to_id in unit_ids for k in got["links"])
    no_observations = _sections(store, bank, BankSelection(observations=False))
    assert no_observations["count"] == 5 and no_observations["observations"] == []


def test_read_bank_is_one_snapshot(store: SqlMemoryStore) -> None:
    bank = _filled(store)
    with store.read_bank(bank.ref, BankSelection()) as reader:
        pages = reader.units(1)
        first = next(pages)
        late = threading.Thread(
            target=store.write_document, args=(bank.ref, _doc([_unit("late")], "doc-0"))
        )
        late.start()
        late.join()
        rest = [u for page in pages for u in page]
        documents = [d.document_id for page in reader.documents(10) for d in page]
    assert len(first) + len(rest) == 5 and "late" not in {u.text for u in rest}
    assert documents == ["doc-a", "doc-b"]
    assert store.get_document(bank.ref, "doc-0") is not None  # written meanwhile, unseen


def test_read_bank_stops_when_cancelled(store: SqlMemoryStore) -> None:
    bank = _filled(store)
    token = CancellationToken()
    with (
        use_context(RequestContext(token=token)),
        store.read_bank(bank.ref, BankSelection()) as reader,
    ):
        pages = reader.units(1)
        next(pages)
        token.cancel("stop")
        with pytest.raises(OperationCancelled):
            next(pages)


def _copy(store: SqlMemoryStore, source: Bank, target: Bank) -> dict[str, str]:
    """Copy *source*'s rows into *target* under fresh ids; old id -> new id."""
    fresh: dict[str, str] = {}

    def new(old: str) -> str:
        return fresh.setdefault(old, str(uuid.uuid4()))

    with store.read_bank(source.ref, BankSelection()) as reader:
        documents = [d for page in reader.documents(10) for d in page]
        units = [u for page in reader.units(2) for u in page]
        observations = [u for page in reader.observations(10) for u in page]
        entities = [e for page in reader.entities(10) for e in page]
        memberships = [m for page in reader.memberships(10) for m in page]
        links = [k for page in reader.links(10) for k in page]
    for document in documents:
        document.chunks = [replace(c, id=new(c.id)) for c in document.chunks]
        mine = [u for u in units if u.document_id == document.document_id]
        for unit in mine:
            unit.id, unit.chunk_id = new(unit.id), new(unit.chunk_id or "")
        assert store.write_document_rows(target.ref, document, [mine[:2], mine[2:]]) == len(mine)
    for unit in observations:
        unit.id, unit.source_ids = new(unit.id), [new(s) for s in unit.source_ids]
    assert store.write_unit_rows(target.ref, observations) == 2
    assert store.write_entity_rows(target.ref, [replace(e, id=new(e.id)) for e in entities]) == 3
    moved = [MembershipRow(new(m.unit_id), new(m.entity_id)) for m in memberships]
    assert store.write_membership_rows(target.ref, moved) == len(memberships)
    relinked = [replace(k, from_id=new(k.from_id), to_id=new(k.to_id)) for k in links]
    assert store.write_link_rows(target.ref, relinked) == len(links)
    return fresh


def test_write_document_rows_and_the_rest_copy_a_bank_that_answers_alike(
    store: SqlMemoryStore,
) -> None:
    source = _filled(store)
    target = _bank(store, "copy")
    fresh = _copy(store, source, target)
    assert store.bank_stats(target.ref).units_by_type == store.bank_stats(source.ref).units_by_type
    assert store.bank_stats(target.ref).links_by_type == store.bank_stats(source.ref).links_by_type

    def texts(bank: Bank, hits: list[tuple[int, float]]) -> list[tuple[str, float]]:
        units = store.fetch_units(bank.ref, [seq for seq, _ in hits])
        return [(units[seq].text, round(score, 4)) for seq, score in hits]

    for bank in (source, target):
        assert store.get_document(bank.ref, "doc-a") is not None
    assert texts(target, store.keyword_search(target.ref, ["tom", "sea"], 10)) == texts(
        source, store.keyword_search(source.ref, ["tom", "sea"], 10)
    )
    assert texts(target, store.units_by_entities(target.ref, ["tom", "bob"], 10)) == texts(
        source, store.units_by_entities(source.ref, ["tom", "bob"], 10)
    )
    query = _vector(3)
    assert texts(target, store.vector_search(target.ref, query, 4, None)) == texts(
        source, store.vector_search(source.ref, query, 4, None)
    )
    a_seq = store.keyword_search(source.ref, ["adopted"], 1)[0][0]
    b_seq = store.keyword_search(target.ref, ["adopted"], 1)[0][0]
    assert texts(target, store.linked_units(target.ref, [b_seq], 10)) == texts(
        source, store.linked_units(source.ref, [a_seq], 10)
    )
    copied = store.units_by_ids(target.ref, [fresh[i] for i in fresh])
    cat = next(u for u in copied if u.text == "Alice owns a grey cat")
    assert cat.proof_count == 2
    assert cat.history == [{"text": "Alice owns a cat", "reason": "updated"}]
    assert {u.text for u in store.units_by_ids(target.ref, cat.source_ids)} == {
        "Alice: I adopted a cat named Tom",
        "Alice: Tom is grey",
    }
    # A document's units are consecutive, so recall's neighbours are its neighbours.
    seqs = sorted(u.seq for u in copied if u.document_id == "doc-a")
    assert seqs == list(range(seqs[0], seqs[0] + 3))
    # Timestamps are the source's, not the copy's.
    [original] = [u for u in store.units_by_ids(source.ref, list(fresh)) if u.text == "Bob sails"]
    [twin] = store.units_by_ids(target.ref, [fresh[original.id]])
    assert (twin.text, twin.created_at) == (original.text, original.created_at)


def _document(units: int, document_id: str = "d") -> DocumentRow:
    return DocumentRow(
        document_id,
        "text",
        None,
        {},
        [],
        "2024-01-01T00:00:00+00:00",
        "2024-01-01T00:00:00+00:00",
        units,
    )


def _row(text: str, document_id: str | None = "d", vector: np.ndarray | None = None):  # type: ignore[no-untyped-def]
    from heed.transfer.rows import UnitRow

    return UnitRow(
        id=str(uuid.uuid4()),
        document_id=document_id,
        chunk_id=None,
        text=text,
        index_text=text,
        fact_type="world",
        context=None,
        occurred_start=None,
        occurred_end=None,
        mentioned_at=None,
        metadata={},
        tags=[],
        created_at="2024-01-01T00:00:00+00:00",
        updated_at=None,
        token_count=1,
        consolidation_state=None,
        source_ids=[],
        proof_count=None,
        history=[],
        vector=_vector(9) if vector is None else vector,
    )


def test_write_document_rows_refuses_what_does_not_fit(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    cases = [
        (_document(2, "a"), [[_row("one", "a")]], "not its unit_count"),
        (_document(1, "b"), [[_row("one", "b"), _row("two", "b")]], "more memories"),
        (_document(1, "c"), [[_row("one", "other")]], "belongs to document"),
        (_document(1, "d"), [[_row("x", "d", vector=np.ones(3))]], "3-dimensional vector"),
    ]
    for document, batches, says in cases:
        with pytest.raises(ValueError, match=says):
            store.write_document_rows(bank.ref, document, batches)
    with pytest.raises(InvalidText):
        store.write_document_rows(bank.ref, _document(1, "e"), [[_row("nul\x00", "e")]])
    with pytest.raises(InvalidText):  # refused before anything is written
        store.write_document_rows(bank.ref, replace(_document(1, "f"), original_text="\x00"), [])
    assert store.get_document(bank.ref, "f") is None
    assert store.write_document_rows(bank.ref, _document(1, "g"), [[_row("one", "g")]]) == 1
    with pytest.raises(ValueError, match="in the bank already"):
        store.write_document_rows(bank.ref, _document(1, "g"), [[_row("again", "g")]])
    store.delete_bank(bank.ref)
    with pytest.raises(BankGone):
        store.write_document_rows(bank.ref, _document(1, "h"), [[_row("late", "h")]])
    assert _count(store, "memory_units") == 0  # the bank's rows went with it


def test_write_document_rows_reserves_the_seqs_of_a_document_written_in_batches(
    store: SqlMemoryStore,
) -> None:
    bank, other = _bank(store), _bank(store, "other")
    token = CancellationToken()
    seen: list[int] = []

    def batches() -> Iterator[list[object]]:
        for i in range(3):
            yield [_row(f"unit {i}-{j}") for j in range(100)]
            # Between batches another writer gets in, and takes none of the document's seqs.
            seen.extend(s for s, _ in store.write_document(other.ref, _doc([_unit("x")])).added)

    store.write_document_rows(bank.ref, _document(300), batches())  # type: ignore[arg-type]
    units = store.list_units(bank.ref, UnitFilter(document_id="d"), -1, 0)[0]
    seqs = sorted(u.seq for u in units)
    assert seqs == list(range(seqs[0], seqs[0] + 300))  # consecutive, placeholder replaced
    assert not set(seen) & set(seqs)
    assert all(u.text.startswith("unit ") for u in units)
    assert store.keyword_search(bank.ref, ["unit"], -1)  # each batch indexed

    def cancelled() -> Iterator[list[object]]:
        yield [_row(f"kept {i}", "e") for i in range(100)]
        token.cancel("stop")
        yield [_row("never", "e")]

    with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
        store.write_document_rows(bank.ref, _document(101, "e"), cancelled())  # type: ignore[arg-type]
    written = store.list_units(bank.ref, UnitFilter(document_id="e"), -1, 0)[0]
    # The batches before the cancel stay (for the caller to discard with its staging bank);
    # nothing after it is written.
    assert {u.text for u in written} - {""} == {f"kept {i}" for i in range(100)}
    assert "never" not in {u.text for u in written}


def test_write_unit_rows_takes_observations_only(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    with pytest.raises(ValueError, match="write it with its document"):
        store.write_unit_rows(bank.ref, [_row("a document's")])
    assert store.write_unit_rows(bank.ref, []) == 0
    observation = replace(_row("Alice likes cats", None), fact_type="observation")
    assert store.write_unit_rows(bank.ref, [observation]) == 1
    [(seq, _)] = store.keyword_search(bank.ref, ["cats"], 5)
    assert store.fetch_units(bank.ref, [seq])[seq].fact_type == "observation"
    store.delete_bank(bank.ref)
    with pytest.raises(BankGone):
        store.write_unit_rows(bank.ref, [replace(observation, id=str(uuid.uuid4()))])


def test_write_entity_rows_write_membership_rows_and_write_link_rows_check_ids(
    store: SqlMemoryStore,
) -> None:
    bank, other = _bank(store), _bank(store, "other")
    one, two = _row("Alice: hello", None), _row("Alice: bye", None)
    store.write_unit_rows(bank.ref, [one, two])
    alice = EntityRow(str(uuid.uuid4()), "Alice", "person")
    with pytest.raises(ValueError, match="no name"):
        store.write_entity_rows(bank.ref, [EntityRow("e", "  ", None)])
    assert store.write_entity_rows(bank.ref, [alice]) == 1
    stranger = EntityRow(str(uuid.uuid4()), "Stranger", None)
    store.write_entity_rows(other.ref, [stranger])
    with pytest.raises(ValueError, match="does not hold"):
        store.write_membership_rows(bank.ref, [MembershipRow("missing", alice.id)])
    with pytest.raises(ValueError, match="not the bank's"):
        store.write_membership_rows(bank.ref, [MembershipRow(one.id, stranger.id)])
    rows = [MembershipRow(one.id, alice.id), MembershipRow(two.id, alice.id)]
    assert store.write_membership_rows(bank.ref, rows) == 2
    assert store.write_membership_rows(bank.ref, rows) == 0  # already there
    assert [s for s, _ in store.units_by_entities(bank.ref, ["alice"], 5)]
    with pytest.raises(ValueError, match="does not hold"):
        store.write_link_rows(bank.ref, [LinkRow(one.id, "missing", "entity", 1.0)])
    assert store.write_link_rows(bank.ref, [LinkRow(one.id, two.id, "entity", 0.5)]) == 1
    seq_one = store.keyword_search(bank.ref, ["hello"], 1)[0][0]
    assert len(store.linked_units(bank.ref, [seq_one], 5)) == 1
    assert store.write_membership_rows(bank.ref, []) == store.write_link_rows(bank.ref, []) == 0


def test_publish_bank_moves_a_bank_whole(store: SqlMemoryStore) -> None:
    staging = _bank(store, "staging-1", tenant="hidden")
    store.write_unit_rows(staging.ref, [_row("Alice likes cats", None)])
    taken = _bank(store, "taken")
    ready = Bank(
        tenant="t",
        bank_id="imported",
        ref=staging.ref,
        name="Imported",
        mission="m",
        config={"enable_observations": True},
    )
    published = store.publish_bank(ready)
    assert published.created_at == staging.created_at
    got = store.get_bank("t", "imported")
    assert got is not None and got.ref == staging.ref and got.name == "Imported"
    assert got.config == {"enable_observations": True} and got.mission == "m"
    assert store.get_bank("hidden", "staging-1") is None
    assert store.list_banks("t", 10, 0)[0][0][1] == 1  # its unit came along
    with pytest.raises(BankTaken):
        store.publish_bank(replace(ready, bank_id=taken.bank_id))
    assert store.get_bank("t", "imported") is not None  # unchanged
    with pytest.raises(BankGone):
        store.publish_bank(replace(ready, ref=str(uuid.uuid4())))


def test_delete_bank_in_batches_leaves_nothing_and_other_banks_alone(
    store: SqlMemoryStore,
) -> None:
    doomed, kept = _filled(store, "doomed"), _filled(store, "kept")
    before = {t: _count(store, t) for t in ("memory_units", "memory_links", "memory_entities")}
    assert store.delete_bank_in_batches(doomed.ref, 2) == 7
    assert store.get_bank("t", "doomed") is None
    assert store.delete_bank_in_batches(doomed.ref, 2) == 0  # gone already
    for table, n in before.items():
        assert _count(store, table) == n // 2, table
    assert _count(store, "memory_units", f"WHERE bank_ref = '{doomed.ref}'") == 0
    for table in ("memory_documents", "memory_chunks", "memory_values", "memory_entities"):
        assert _count(store, table, f"WHERE bank_ref = '{doomed.ref}'") == 0, table
    assert len(store.keyword_search(kept.ref, ["tom"], 10)) == 3
    assert store.keyword_search(doomed.ref, ["tom"], 10) == []


def test_write_document_rows_in_parts_written_at_once(store: SqlMemoryStore) -> None:
    """A batch larger than a transaction is split (on PostgreSQL among several
    connections at once): the seqs stay consecutive, the placeholder is replaced, and
    long values shared by the parts, met in opposite orders, are stored once each."""
    bank = _bank(store)
    contexts = [f"context {i} " + "c" * 100 for i in range(4)]
    rows = []
    for i in range(600):
        order = contexts if i < 256 else contexts[::-1]  # the first two parts: opposite orders
        rows.append(replace(_row(f"part unit {i}"), context=order[i % 4], tags=[f"t{i % 3}" * 40]))
    assert store.write_document_rows(bank.ref, _document(600), [rows]) == 600
    units = store.list_units(bank.ref, UnitFilter(document_id="d"), -1, 0)[0]
    assert sorted(u.seq for u in units) == list(
        range(min(u.seq for u in units), 600 + min(u.seq for u in units))
    )
    by_text = {u.text: u for u in units}
    assert set(by_text) == {f"part unit {i}" for i in range(600)}
    assert by_text["part unit 301"].context == contexts[::-1][301 % 4]
    assert by_text["part unit 5"].tags == ["t2" * 40]
    assert _count(store, "memory_values", f"WHERE bank_ref = '{bank.ref}'") == 4 + 3
    assert len(store.keyword_search(bank.ref, ["part"], -1)) == 600


def test_write_document_rows_stops_a_running_statement_when_cancelled(
    store: SqlMemoryStore,
) -> None:
    """On PostgreSQL a cancel stops the statement a part is running (here: waiting for the
    bank's lock, which another transaction holds), whatever the part's size."""
    if store.db.dialect != "postgresql":
        pytest.skip("SQLite's writes stop between transactions (tested above)")
    import psycopg

    from heed.storage.postgres import PostgresDatabase

    assert isinstance(store.db, PostgresDatabase)
    bank = _bank(store)
    token = CancellationToken()
    blocker = psycopg.connect(store.db.url)
    release = threading.Timer(5.0, blocker.rollback)

    def batches() -> Iterator[list[object]]:
        blocker.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("bank:" + bank.ref,)
        )
        threading.Timer(0.2, token.cancel, args=("stop",)).start()
        release.start()  # a write that cannot be cancelled waits 5 s, and fails below
        yield [_row(f"blocked {i}") for i in range(64)]

    try:
        started = time.monotonic()
        with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
            store.write_document_rows(bank.ref, _document(64), batches())  # type: ignore[arg-type]
        assert time.monotonic() - started < 2.0  # 0.2 s, then the statements' cancel
    finally:
        release.cancel()
        if release.ident is not None:
            release.join()
        blocker.rollback()
        blocker.close()
    written = store.list_units(bank.ref, UnitFilter(document_id="d"), -1, 0)[0]
    assert [u.text for u in written] == [""]  # the placeholder alone
