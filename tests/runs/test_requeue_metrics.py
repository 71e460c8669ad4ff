"""Requeued and quarantined runs in /metrics: ``heed_runs_requeued_total{kind}`` and
``heed_runs_quarantined_total{kind}``, counted by the process whose reaper (or restart
recovery) requeued or quarantined the run, exported by the run collector.

The worker deaths are produced in process, as in ``test_requeue``: a manager ("a process")
stops renewing and its leases expire, and another manager's reaper finds the run.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from heed.api.run_metrics import install_run_metrics
from heed.runs.manager import RunManager
from heed.runs.reaper import reap_once
from heed.runs.recovery import recover
from heed.storage import SqlDatabase
from tests.support import metric_value

from .requeue_worker import KIND, MAX_ATTEMPTS
from .test_requeue import Starts, close_all, kill, op_manager, running

REQUEUED = "heed_runs_requeued_total"
QUARANTINED = "heed_runs_quarantined_total"


def scrape(manager: RunManager) -> str:
    registry = CollectorRegistry()
    install_run_metrics(registry, manager)
    return generate_latest(registry).decode()


def counts(manager: RunManager) -> tuple[float, float]:
    text = scrape(manager)
    return metric_value(text, REQUEUED, kind=KIND), metric_value(text, QUARANTINED, kind=KIND)


async def test_requeues_then_the_quarantine_are_counted_by_kind(
    sql_database: SqlDatabase,
) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        # Every kind with max_attempts is exported at 0 before anything happened; a kind
        # without it ("plain", "turn") never is.
        text = scrape(first)
        assert f'{REQUEUED}{{kind="{KIND}"}} 0.0' in text
        assert f'{QUARANTINED}{{kind="{KIND}"}} 0.0' in text
        assert 'kind="plain"' not in text and 'kind="turn"' not in text
        run = await first.submit(KIND, tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        holder = first
        for _ in range(MAX_ATTEMPTS - 1):  # each death but the last: a requeue
            kill(holder)
            holder = op_manager(sql_database, starts)
            managers.append(holder)
            await reap_once(holder, sweep=False)
            await running(holder, starts, run.id)
            assert counts(holder) == (1, 0)
        kill(holder)
        last = op_manager(sql_database, starts)
        managers.append(last)
        await reap_once(last, sweep=False)
        assert counts(last) == (0, 1)
        await reap_once(last)  # terminal: counted once, never again
        assert counts(last) == (0, 1)
        assert counts(first) == (0, 0)  # the process that died counted nothing
    finally:
        await close_all(managers, starts)


async def test_a_requeue_by_restart_recovery_is_counted(sql_database: SqlDatabase) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        run = await first.submit(KIND, tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        kill(first)
        restarted = op_manager(sql_database, starts)
        managers.append(restarted)
        await recover(restarted)
        await running(restarted, starts, run.id)
        assert counts(restarted) == (1, 0)
    finally:
        await close_all(managers, starts)
