"""The memory store's directive part (:class:`heed.memory.store.DirectiveStore`), on both
databases: create under a per-bank limit, list in order, get, partial update, delete, a
deleted bank's directives gone with it, and NUL. Named here for the contract check of
``test_memory_store.py`` (which reads this module's test names too)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from heed.errors import InvalidText
from heed.memory.directives.rules import Directive, DirectivePatch
from heed.memory.store import BankGone
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from tests.storage.test_memory_store import DIM, _bank, _count


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _directive(bank_ref: str, content: str, **fields: object) -> Directive:
    return Directive(
        id=str(uuid.uuid4()),
        bank_ref=bank_ref,
        name=str(fields.pop("name", content[:10])),
        content=content,
        **fields,  # type: ignore[arg-type]
    )


def test_create_directive_sets_times_and_keeps_every_field(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    made = store.create_directive(
        _directive(bank.ref, "Answer in French.", priority=7, is_active=False, tags=["fr"]), 10
    )
    assert made is not None
    assert (made.content, made.priority, made.is_active, made.tags) == (
        "Answer in French.",
        7,
        False,
        ["fr"],
    )
    assert made.created_at and made.created_at == made.updated_at
    assert store.get_directive(bank.ref, made.id) == made


def test_create_directive_refuses_past_the_limit_and_into_a_gone_bank(
    store: SqlMemoryStore,
) -> None:
    bank = _bank(store)
    for i in range(3):
        assert store.create_directive(_directive(bank.ref, f"rule {i}"), 3) is not None
    assert store.create_directive(_directive(bank.ref, "one too many"), 3) is None
    assert len(store.list_directives(bank.ref)) == 3
    with pytest.raises(BankGone):
        store.create_directive(_directive(str(uuid.uuid4()), "nowhere"), 3)
    with pytest.raises(InvalidText):
        store.create_directive(_directive(bank.ref, "bad\x00rule"), 3)
    with pytest.raises(InvalidText):
        store.create_directive(_directive(bank.ref, "rule", tags=["a\x00"]), 3)
    assert len(store.list_directives(bank.ref)) == 3


def test_create_directive_racing_for_the_last_place_takes_it_once(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    results: list[Directive | None] = []
    barrier = threading.Barrier(4)

    def create(i: int) -> None:
        barrier.wait()
        results.append(store.create_directive(_directive(bank.ref, f"racer {i}"), 1))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in results) == 1
    assert len(store.list_directives(bank.ref)) == 1


def test_list_directives_is_by_priority_then_age_and_per_bank(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "one"), _bank(store, "two")
    low = store.create_directive(_directive(bank.ref, "low", priority=-1), 10)
    first = store.create_directive(_directive(bank.ref, "first", priority=5), 10)
    second = store.create_directive(_directive(bank.ref, "second", priority=5), 10)
    top = store.create_directive(_directive(bank.ref, "top", priority=9), 10)
    store.create_directive(_directive(other.ref, "elsewhere"), 10)
    listed = [d.content for d in store.list_directives(bank.ref)]
    assert listed == ["top", "first", "second", "low"]
    assert all(d is not None for d in (low, first, second, top))
    assert [d.content for d in store.list_directives(other.ref)] == ["elsewhere"]
    assert store.list_directives(str(uuid.uuid4())) == []


def test_get_directive_is_per_bank_and_nul_finds_nothing(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "one"), _bank(store, "two")
    made = store.create_directive(_directive(bank.ref, "mine"), 10)
    assert made is not None
    assert store.get_directive(other.ref, made.id) is None
    assert store.get_directive(bank.ref, "missing") is None
    assert store.get_directive(bank.ref, made.id + "\x00") is None


def test_update_directive_changes_only_the_sent_fields(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "one"), _bank(store, "two")
    made = store.create_directive(_directive(bank.ref, "old", priority=1, tags=["a"]), 10)
    assert made is not None
    renamed = store.update_directive(bank.ref, made.id, DirectivePatch(name="renamed"))
    assert renamed is not None
    assert (renamed.name, renamed.content, renamed.priority, renamed.tags) == (
        "renamed",
        "old",
        1,
        ["a"],
    )
    assert renamed.updated_at >= made.updated_at and renamed.created_at == made.created_at
    changed = store.update_directive(
        bank.ref,
        made.id,
        DirectivePatch(content="new", priority=0, is_active=False, tags=[]),
    )
    assert changed is not None
    assert (changed.name, changed.content, changed.priority, changed.is_active, changed.tags) == (
        "renamed",
        "new",
        0,
        False,
        [],
    )
    assert store.get_directive(bank.ref, made.id) == changed
    assert store.update_directive(other.ref, made.id, DirectivePatch(name="x")) is None
    assert store.update_directive(bank.ref, "missing", DirectivePatch(name="x")) is None
    assert store.update_directive(bank.ref, made.id + "\x00", DirectivePatch(name="x")) is None
    with pytest.raises(InvalidText):
        store.update_directive(bank.ref, made.id, DirectivePatch(content="\x00"))
    with pytest.raises(BankGone):
        store.update_directive(str(uuid.uuid4()), made.id, DirectivePatch(name="x"))
    assert store.get_directive(bank.ref, made.id) == changed


def test_delete_directive_and_a_deleted_bank_takes_its_directives(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "one"), _bank(store, "two")
    made = store.create_directive(_directive(bank.ref, "going"), 10)
    kept = store.create_directive(_directive(bank.ref, "staying"), 10)
    theirs = store.create_directive(_directive(other.ref, "theirs"), 10)
    assert made is not None and kept is not None and theirs is not None
    assert not store.delete_directive(other.ref, made.id)
    assert store.delete_directive(bank.ref, made.id)
    assert not store.delete_directive(bank.ref, made.id)
    assert not store.delete_directive(bank.ref, made.id + "\x00")
    assert [d.id for d in store.list_directives(bank.ref)] == [kept.id]
    store.delete_bank(bank.ref)
    assert _count(store, "memory_directives", f"WHERE bank_ref = '{bank.ref}'") == 0
    assert [d.id for d in store.list_directives(other.ref)] == [theirs.id]
