"""The rules a bank's runs share (:mod:`heed.memory.bank_runs`): the prelude that ends a run
whose bank is gone or replaced, and per-bank timers that die with their bank."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from heed.memory import MemoryEngine
from heed.memory.bank_runs import RETAIN_KIND, BankTimers
from heed.memory.directives.service import DirectiveService
from heed.memory.models import NotFound, RetainItem
from heed.memory.retain.operations import RetainOperations
from heed.memory.store import UnitFilter
from heed.runs.manager import RunManager
from heed.runtime import RequestContext, use_context
from tests.runs.conftest import build_manager


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[RunManager]:
    m = build_manager(tmp_path / "runs.db")
    yield m
    await m.close(grace=2)


@pytest.mark.parametrize("fate", ["deleted", "replaced"])
async def test_a_retain_whose_bank_went_before_it_ran_is_cancelled_and_writes_nothing(
    engine: MemoryEngine, manager: RunManager, fate: str
) -> None:
    """Another process deleted the bank (and, *replaced*, created a new one of the same id)
    after the operation was submitted: it ends ``cancelled`` with reason ``bank deleted``,
    as a consolidation, a refresh or a reflect does, and writes into no bank."""
    operations = RetainOperations(manager, engine)
    manager.register(RETAIN_KIND, operations.kind_spec())
    with use_context(RequestContext()):
        bank = await engine.put_bank("b", {})
        await asyncio.to_thread(engine.store.delete_bank, bank.ref)  # another process's delete
        if fate == "replaced":
            await engine.put_bank("b", {})
        run = await operations.submit(bank, [RetainItem(content="Eve: a late fact")], [])
        ended = await manager.wait_stopped(run.id, 10)
        assert (ended.phase, ended.cancel_reason) == ("cancelled", "bank deleted"), ended.error
        banks, _ = await asyncio.to_thread(engine.store.list_banks, "default", 10, 0)
        now = [(b.ref, units) for b, units in banks]
        assert now == ([((await engine.get_bank("b")).ref, 0)] if fate == "replaced" else [])
        assert bank.ref not in {ref for ref, _ in now}
        units = await asyncio.to_thread(engine.store.list_units, bank.ref, UnitFilter(), 10, 0)
        assert units == ([], 0)


async def test_bank_timers_run_one_task_per_key_and_die_with_their_bank(
    engine: MemoryEngine,
) -> None:
    timers = BankTimers(engine)
    release = asyncio.Event()
    started: list[str] = []

    async def work(name: str) -> None:
        started.append(name)
        await release.wait()

    assert timers.start("r1", lambda: work("first"))
    assert not timers.start("r1", lambda: work("second")), "one task per (bank, key)"
    assert timers.start("r1", lambda: work("model"), "m1")
    assert timers.start("r2", lambda: work("other bank"))
    await asyncio.sleep(0)
    assert sorted(started) == ["first", "model", "other bank"]

    with use_context(RequestContext()):
        bank = await engine.put_bank("timers", {})
    bank.ref = "r1"  # stands for the bank whose timers those are
    for hook in engine.before_delete:
        await hook(bank)
    await asyncio.sleep(0)
    assert not timers.running("r1") and not timers.running("r1", "m1")
    assert timers.running("r2")
    assert timers.start("r1", lambda: work("again")), "a cancelled slot is free again"

    await timers.aclose()
    assert not timers.running("r1") and not timers.running("r2")


@pytest.mark.parametrize("write", ["directive", "memory"])
async def test_a_write_into_a_bank_another_process_deleted_is_a_404_that_forgets_it(
    engine: MemoryEngine, write: str
) -> None:
    """The one bank-gone rule (:meth:`MemoryEngine.bank_gone_is_not_found`): whichever write
    finds the bank gone answers 404 and this process forgets the bank at once (a cached
    row would otherwise answer for it for up to a second)."""
    with use_context(RequestContext()):
        bank = await engine.put_bank("gone", {})
        await engine.get_bank("gone")  # cached
        await asyncio.to_thread(engine.store.delete_bank, bank.ref)  # another process's delete
        with pytest.raises(NotFound, match="'gone' not found"):
            if write == "directive":
                await DirectiveService(engine).create("gone", name="rule", content="Be brief.")
            else:
                await engine.retain(bank, [RetainItem(content="Eve: a late fact")])
        with pytest.raises(NotFound):
            await engine.get_bank("gone")  # not from the cache
