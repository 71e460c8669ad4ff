"""The memory store's consolidation part (:class:`heed.memory.store.LearningStore`), on both
databases: pending units, observations written, replaced, merged and deleted, provenance,
and recovery of failed units. Named here for the contract check of
``test_memory_store.py`` (which reads this module's test names too)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from heed.memory.models import PreparedUnit
from heed.memory.store import BankGone, ObservationChanges, UnitFilter
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from tests.storage.test_memory_store import DIM, _bank, _doc, _unit, _vector


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _pending(text: str, i: int, *entities: str) -> PreparedUnit:
    unit = _unit(text, *entities, vector=_vector(i))
    unit.consolidation_state = "pending"
    return unit


def _observation(text: str, i: int, sources: list[str], *entities: str) -> PreparedUnit:
    unit = _unit(text, *entities, vector=_vector(i), fact_type="observation")
    unit.source_ids = sources
    unit.proof_count = len(sources)
    return unit


def test_pending_units_are_oldest_first_and_limited(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    plain = _unit("not for consolidation", vector=_vector(0))
    units = [_pending(f"fact {i}", i + 1) for i in range(5)]
    store.write_document(bank.ref, _doc([plain, *units]))
    got = store.pending_units(bank.ref, 3)
    assert [u.text for u in got] == ["fact 0", "fact 1", "fact 2"]
    assert all(u.consolidation_state == "pending" for u in got)
    assert len(store.pending_units(bank.ref, -1)) == 5
    assert store.pending_units(bank.ref, 0) == []
    other = _bank(store, "other")
    assert store.pending_units(other.ref, 10) == []


def test_units_by_ids_reads_provenance_and_skips_missing(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    turn = _unit("Caroline: I adopted a dog", vector=_vector(1))
    fact = _pending("Caroline adopted a dog", 2, "Caroline")
    fact.source_ids = [turn.id]
    store.write_document(bank.ref, _doc([turn, fact]))
    got = store.units_by_ids(bank.ref, [fact.id, "missing", "a\x00b", turn.id])
    assert [u.id for u in got] == [turn.id, fact.id]
    assert got[1].source_ids == [turn.id]
    assert got[0].source_ids == []
    assert store.units_by_ids(_bank(store, "x").ref, [fact.id]) == []


def test_write_observations_creates_replaces_merges_and_marks_facts(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    facts = [_pending(f"Caroline fact {i}", i, "Caroline") for i in range(4)]
    written = store.write_document(bank.ref, _doc(facts)).added
    seqs = [seq for seq, _ in written]
    first = _observation("Caroline likes dogs", 10, [facts[0].id], "Caroline")
    second = _observation("Caroline has a pet", 11, [facts[1].id])
    result = store.write_observations(
        bank.ref,
        ObservationChanges(created=[first, second], done=seqs[:2], failed=[seqs[2]]),
    )
    assert len(result.added) == 2 and result.removed == []
    observations, total = store.list_units(bank.ref, UnitFilter(fact_type="observation"), 10, 0)
    assert total == 2
    by_id = {u.id: u for u in observations}
    assert by_id[first.id].source_ids == [facts[0].id]
    assert by_id[first.id].proof_count == 1
    assert by_id[first.id].entities == ["Caroline"]
    assert [u.text for u in store.pending_units(bank.ref, 10)] == ["Caroline fact 3"]
    states = {
        s: store.list_units(bank.ref, UnitFilter(consolidation_state=s), 10, 0)[1]
        for s in ("pending", "done", "failed")
    }
    assert states == {"pending": 1, "done": 2, "failed": 1}

    # An update keeps the id and the history; a merge removes the other observation.
    updated = _observation("Caroline loves dogs", 12, [facts[0].id, facts[3].id], "Caroline")
    updated.id = first.id
    updated.history = [{"text": "Caroline likes dogs", "reason": "updated"}]
    again = store.write_observations(
        bank.ref,
        ObservationChanges(replaced=[updated], removed=[second.id], done=[seqs[3]]),
    )
    assert len(again.removed) == 2 and [i for _, i in again.added] == [first.id]
    observations, total = store.list_units(bank.ref, UnitFilter(fact_type="observation"), 10, 0)
    assert total == 1
    [only] = observations
    assert only.id == first.id and only.text == "Caroline loves dogs"
    assert only.history == [{"text": "Caroline likes dogs", "reason": "updated"}]
    assert only.proof_count == 2
    hits = store.keyword_search(bank.ref, ["loves"], 10)
    assert [seq for seq, _ in hits] == [seq for seq, _ in again.added]
    assert store.keyword_search(bank.ref, ["pet"], 10) == []
    # removing a fact is not something write_observations does
    not_an_observation = ObservationChanges(removed=[facts[0].id])
    assert store.write_observations(bank.ref, not_an_observation).removed == []


def test_write_observations_into_a_deleted_bank_writes_nothing(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.delete_bank(bank.ref)
    with pytest.raises(BankGone):
        store.write_observations(bank.ref, ObservationChanges(created=[_observation("x", 1, [])]))
    with store.db.read() as conn:
        assert conn.execute("SELECT COUNT(*) FROM memory_units").fetchone()[0] == 0


def test_delete_observations_all_or_by_source_makes_their_facts_pending(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    facts = [_pending(f"fact {i}", i) for i in range(3)]
    seqs = [seq for seq, _ in store.write_document(bank.ref, _doc(facts)).added]
    a = _observation("obs a", 10, [facts[0].id])
    b = _observation("obs b", 11, [facts[1].id, facts[2].id])
    store.write_observations(bank.ref, ObservationChanges(created=[a, b], done=seqs))
    assert store.pending_units(bank.ref, 10) == []
    result = store.delete_observations(bank.ref, facts[2].id)
    assert len(result.removed) == 1
    left, _ = store.list_units(bank.ref, UnitFilter(fact_type="observation"), 10, 0)
    assert [u.id for u in left] == [a.id]
    assert {u.id for u in store.pending_units(bank.ref, 10)} == {facts[1].id, facts[2].id}
    assert store.delete_observations(bank.ref, "no-such-unit").removed == []
    assert len(store.delete_observations(bank.ref, None).removed) == 1
    assert store.list_units(bank.ref, UnitFilter(fact_type="observation"), 10, 0)[1] == 0
    assert len(store.pending_units(bank.ref, 10)) == 3


def test_recover_consolidation_makes_failed_units_pending(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    facts = [_pending(f"fact {i}", i) for i in range(3)]
    seqs = [seq for seq, _ in store.write_document(bank.ref, _doc(facts)).added]
    store.write_observations(bank.ref, ObservationChanges(failed=seqs[:2], done=[seqs[2]]))
    assert store.pending_units(bank.ref, 10) == []
    assert store.recover_consolidation(bank.ref) == 2
    assert len(store.pending_units(bank.ref, 10)) == 2
    assert store.recover_consolidation(bank.ref) == 0
    assert uuid.UUID(facts[0].id)


def test_banks_with_pending_lists_banks_of_every_tenant_with_pending_units(
    store: SqlMemoryStore,
) -> None:
    quiet = _bank(store, "quiet")
    busy = _bank(store, "busy")
    other = _bank(store, "elsewhere", tenant="tenant-b")
    store.write_document(quiet.ref, _doc([_unit("plain", vector=_vector(0))]))
    store.write_document(busy.ref, _doc([_pending("fact", 1)]))
    written = store.write_document(other.ref, _doc([_pending("fact b", 2)])).added
    found = store.banks_with_pending(10)
    assert sorted((b.tenant, b.bank_id) for b in found) == sorted(
        [(busy.tenant, "busy"), ("tenant-b", "elsewhere")]
    )
    assert len(store.banks_with_pending(1)) == 1
    store.write_observations(other.ref, ObservationChanges(done=[seq for seq, _ in written]))
    assert [b.bank_id for b in store.banks_with_pending(10)] == ["busy"]
