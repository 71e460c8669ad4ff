"""The memory store's mental-model part (:class:`heed.memory.store.MentalModelStore`), on both
databases: models, their bounded history, knowledge-base folders and the tree rules, and the
cascade of a bank delete. Every method of the protocol is named by a test here."""

from __future__ import annotations

import inspect
import sqlite3
import sys
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from heed.memory.models import Conflict, InvalidInput, NotFound
from heed.memory.store import BankGone
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import HistoryEntry, KnowledgeFolder, MentalModel, MentalModelRow
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from tests.storage.test_memory_store import DIM, _bank, _unit, _write


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _model(bank_ref: str, model_id: str, **kw: object) -> MentalModel:
    fields: dict[str, object] = {"name": f"name {model_id}", "source_query": "Who?", **kw}
    return MentalModel(bank_ref=bank_ref, id=model_id, **fields)  # type: ignore[arg-type]


def test_create_mental_model_and_get_mental_model_and_mental_models(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    vector = np.arange(DIM, dtype=np.float32)
    made = store.create_mental_model(_model(bank.ref, "m1", tags=["a"], embedding=vector), 10)
    assert made.created_at and made.is_stale  # never refreshed
    got = store.get_mental_model(bank.ref, "m1")
    assert got is not None and got.tags == ["a"] and got.trigger["mode"] == "full"
    assert got.embedding is not None and np.array_equal(got.embedding, vector)
    store.create_mental_model(_model(bank.ref, "m2"), 10)
    listed = store.mental_models(bank.ref)
    assert [m.id for m in listed] == ["m1", "m2"] and listed[0].embedding is None
    assert store.mental_models(bank.ref, True)[0].embedding is not None
    with pytest.raises(Conflict):
        store.create_mental_model(_model(bank.ref, "m1"), 10)
    with pytest.raises(InvalidInput):
        store.create_mental_model(_model(bank.ref, "m3"), 2)
    assert store.get_mental_model(bank.ref, "m\x00") is None
    assert store.get_mental_model(_bank(store, "other").ref, "m1") is None
    with pytest.raises(BankGone):
        store.create_mental_model(_model("no-such-bank", "x"), 10)


def test_write_mental_model_content_keeps_a_bounded_mental_model_history(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    store.create_mental_model(_model(bank.ref, "m"), 10)
    for i in range(5):
        written = store.write_mental_model_content(
            bank.ref,
            "m",
            f"v{i}",
            {"text": f"v{i}"},
            None,
            reason="refreshed",
            history_limit=3,
            refreshed=True,
        )
        assert written is not None and written.content == f"v{i}"
    same = store.write_mental_model_content(
        bank.ref, "m", "v4", None, None, reason="refreshed", history_limit=3, refreshed=True
    )
    assert same is not None and same.last_refreshed_at and not same.is_stale
    history = store.mental_model_history(bank.ref, "m")
    assert [h.previous_content for h in history] == ["v3", "v2", "v1"]  # newest first, 3 kept
    assert [h.version for h in history] == [4, 3, 2]
    assert (
        store.write_mental_model_content(
            bank.ref, "gone", "x", None, None, reason="r", history_limit=3, refreshed=True
        )
        is None
    )


def test_update_mental_model_and_mark_refresh_failed(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.create_mental_model(_model(bank.ref, "m"), 10)
    updated = store.update_mental_model(
        bank.ref, "m", {"name": "new", "tags": ["x"], "trigger": {"mode": "full", "k": 1}}
    )
    assert updated is not None and updated.name == "new" and updated.tags == ["x"]
    assert updated.trigger["k"] == 1
    assert store.update_mental_model(bank.ref, "nope", {"name": "n"}) is None
    store.mark_refresh_failed(bank.ref, "m")
    failed = store.get_mental_model(bank.ref, "m")
    assert failed is not None and failed.last_refresh_failed_at


def test_refresh_fingerprint_and_mark_refresh_skipped(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.create_mental_model(_model(bank.ref, "m"), 10)
    assert store.refresh_fingerprint(bank.ref, "m") is None  # never refreshed
    assert not store.mark_refresh_skipped(bank.ref, "m", "f1")
    store.write_mental_model_content(
        bank.ref,
        "m",
        "v1",
        None,
        None,
        reason="refreshed",
        history_limit=3,
        refreshed=True,
        fingerprint="f1",
    )
    assert store.refresh_fingerprint(bank.ref, "m") == "f1"
    before = store.get_mental_model(bank.ref, "m")
    assert before is not None
    assert not store.mark_refresh_skipped(bank.ref, "m", "f2")  # another fingerprint
    assert store.mark_refresh_skipped(bank.ref, "m", "f1")
    after = store.get_mental_model(bank.ref, "m")
    assert after is not None and after.content == "v1" and after.updated_at == before.updated_at
    assert after.last_refreshed_at and after.last_refreshed_at >= (before.last_refreshed_at or "")
    assert store.mental_model_history(bank.ref, "m") == []
    # Any other write of the content (a clear) empties it.
    store.write_mental_model_content(
        bank.ref, "m", "", None, None, reason="cleared", history_limit=3, refreshed=False
    )
    assert store.refresh_fingerprint(bank.ref, "m") is None
    assert store.refresh_fingerprint(bank.ref, "gone") is None
    assert store.refresh_fingerprint(bank.ref, "m\x00") is None
    assert not store.mark_refresh_skipped(bank.ref, "m\x00", "f1")


def test_scope_digest_changes_only_with_the_units_in_its_scope(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    empty = store.scope_digest(bank.ref, ["pets"], "all_strict", None)
    assert empty == [0, 0, 0, 0]
    _write(store, bank, _unit("Alice has a cat.", tags=["pets"]))
    one = store.scope_digest(bank.ref, ["pets"], "all_strict", None)
    assert one[0] == 1 and one != empty
    whole = store.scope_digest(bank.ref, None, "any", None)
    # Outside the scope: another tag, or another fact type than asked for.
    _write(store, bank, _unit("Bob plays the violin.", tags=["music"]))
    assert store.scope_digest(bank.ref, ["pets"], "all_strict", None) == one
    assert store.scope_digest(bank.ref, None, "any", None) != whole
    assert store.scope_digest(bank.ref, ["pets"], "all_strict", ["experience"]) == empty
    assert store.scope_digest(bank.ref, ["pets"], "all_strict", []) == empty
    # A unit replaced by another (delete and insert, the same count) changes it.
    [seq] = _write(store, bank, _unit("Alice has a dog.", tags=["pets"]), doc="dog")
    two = store.scope_digest(bank.ref, ["pets"], "all_strict", None)
    assert two[0] == 2
    _write(store, bank, _unit("Alice has a puppy.", tags=["pets"]), doc="dog")
    replaced = store.scope_digest(bank.ref, ["pets"], "all_strict", None)
    assert replaced[0] == 2 and replaced != two
    assert store.scope_digest(bank.ref, ["pets"], "all_strict", ["world"]) == replaced
    assert store.scope_digest(bank.ref, ["p\x00"], "all_strict", None) == empty
    assert seq > 0


def test_create_knowledge_folder_update_knowledge_folder_knowledge_folders_delete_knowledge_node(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    top = store.create_knowledge_folder(KnowledgeFolder(bank.ref, "f1", "Top"), 10)
    sub = store.create_knowledge_folder(KnowledgeFolder(bank.ref, "f2", "Sub", "f1"), 10)
    assert [f.id for f in store.knowledge_folders(bank.ref)] == [top.id, sub.id]
    with pytest.raises(Conflict):  # a sibling of the same name
        store.create_knowledge_folder(KnowledgeFolder(bank.ref, "f3", "Top"), 10)
    with pytest.raises(NotFound):
        store.create_knowledge_folder(KnowledgeFolder(bank.ref, "f4", "X", "missing"), 10)
    store.create_mental_model(_model(bank.ref, "p1", is_page=True, parent_id="f2"), 10)
    store.create_mental_model(_model(bank.ref, "p2", is_page=True, parent_id="f1"), 10)
    store.create_mental_model(_model(bank.ref, "loose"), 10)
    with pytest.raises(Conflict):  # a page named like its sibling page
        store.create_mental_model(
            _model(bank.ref, "p3", is_page=True, parent_id="f2", name="name p1"), 10
        )
    with pytest.raises(InvalidInput):  # under its own subtree
        store.update_knowledge_folder(bank.ref, "f1", {"parent_id": "f2"})
    moved = store.update_knowledge_folder(bank.ref, "f2", {"parent_id": None, "name": "Moved"})
    assert moved is not None and moved.parent_id is None and moved.name == "Moved"
    assert store.update_knowledge_folder(bank.ref, "nope", {"name": "n"}) is None
    store.update_knowledge_folder(bank.ref, "f2", {"parent_id": "f1"})
    assert sorted(store.delete_knowledge_node(bank.ref, "f1") or []) == ["p1", "p2"]
    assert store.knowledge_folders(bank.ref) == []
    assert [m.id for m in store.mental_models(bank.ref)] == ["loose"]
    assert store.delete_knowledge_node(bank.ref, "f1") is None
    assert store.delete_knowledge_node(bank.ref, "loose") is None  # not a page


def test_delete_mental_model_and_a_bank_delete_cascade(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.create_mental_model(_model(bank.ref, "m"), 10)
    store.write_mental_model_content(
        bank.ref, "m", "a", None, None, reason="r", history_limit=5, refreshed=True
    )
    store.write_mental_model_content(
        bank.ref, "m", "b", None, None, reason="r", history_limit=5, refreshed=True
    )
    assert store.delete_mental_model(bank.ref, "m") is True
    assert store.delete_mental_model(bank.ref, "m") is False
    assert store.mental_model_history(bank.ref, "m") == []
    store.create_mental_model(_model(bank.ref, "k"), 10)
    store.create_knowledge_folder(KnowledgeFolder(bank.ref, "f", "F"), 10)
    store.delete_bank(bank.ref)
    assert store.mental_models(bank.ref) == [] and store.knowledge_folders(bank.ref) == []


def test_write_knowledge_rows_keeps_what_it_is_given(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    when = "2024-05-01T10:00:00+00:00"
    folder = KnowledgeFolder(bank.ref, "f", "Folder", created_at=when, updated_at=when)
    page = _model(
        bank.ref,
        "p",
        is_page=True,
        parent_id="f",
        content="now",
        created_at=when,
        updated_at=when,
        last_refreshed_at=when,
        embedding=np.ones(DIM, dtype=np.float32),
    )
    history = [HistoryEntry(2, "before", when, "refreshed"), HistoryEntry(1, "first", when, "x")]
    assert store.write_knowledge_rows(bank.ref, [folder], [MentalModelRow(page, history)]) == 2
    got = store.get_mental_model(bank.ref, "p")
    assert got is not None and got.content == "now" and got.parent_id == "f"
    assert got.created_at == when and got.last_refreshed_at == when
    assert got.embedding is not None and float(got.embedding.sum()) == DIM
    assert store.mental_model_history(bank.ref, "p") == history
    assert [(f.id, f.created_at) for f in store.knowledge_folders(bank.ref)] == [("f", when)]
    # An id taken fails the whole write: nothing of it is kept.
    again = _model(bank.ref, "q", created_at=when, updated_at=when)
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):
        store.write_knowledge_rows(bank.ref, [folder], [MentalModelRow(again)])
    assert store.get_mental_model(bank.ref, "q") is None
    with pytest.raises(BankGone):
        store.write_knowledge_rows("no-such-bank", [folder], [])


def test_every_method_of_the_protocol_is_tested_here() -> None:
    methods = {
        name
        for name, _ in inspect.getmembers(MentalModelStore, inspect.isfunction)
        if not name.startswith("_")
    }
    tests = " ".join(name for name in dir(sys.modules[__name__]) if name.startswith("test_"))
    assert {m for m in methods if m not in tests} == set()
