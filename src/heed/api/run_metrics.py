"""Prometheus metrics of the run machinery, read at scrape time.

- ``heed_runs_wedged``: cancelling runs past the unwind window whose worker is
  still alive (never reclaimed by age alone; a human should look).
- ``heed_runs_active_workers``: worker tasks alive in this process.
- ``heed_runs_reclaimed``: stale cancelling runs finalized by the reaper.
- ``heed_runs_interrupted``: runs finalized as ``interrupted`` (worker lost).
- ``heed_runs_requeued{kind}``: runs put back in the queue because their worker died
  (kinds with ``max_attempts``: background operations), by this process's reaper or
  restart recovery.
- ``heed_runs_quarantined{kind}``: runs of those kinds ended ``failed`` because their
  worker died ``max_attempts`` times (:func:`heed.runs.state.is_quarantined`).

Every kind registered with ``max_attempts`` has both series from the start (at 0), so a
rate can be taken before the first requeue.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heed.runs.manager import RunManager

__all__ = ["install_run_metrics"]


class _RunCollector(Collector):
    def __init__(self, manager: RunManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self._manager
        yield GaugeMetricFamily(
            "heed_runs_wedged",
            "Cancelling runs past the unwind window whose worker is still alive",
            value=m.wedged,
        )
        yield GaugeMetricFamily(
            "heed_runs_active_workers", "Run workers alive in this process", value=len(m.workers)
        )
        yield CounterMetricFamily(
            "heed_runs_reclaimed", "Stale cancelling runs finalized", value=m.reclaimed_total
        )
        yield CounterMetricFamily(
            "heed_runs_interrupted", "Runs whose worker was lost", value=m.interrupted_total
        )
        retried = {kind for kind, spec in m.kinds.items() if spec.max_attempts is not None}
        requeued = CounterMetricFamily(
            "heed_runs_requeued",
            "Runs put back in the queue because their worker died, by kind",
            labels=["kind"],
        )
        quarantined = CounterMetricFamily(
            "heed_runs_quarantined",
            "Runs failed as quarantined: their worker died max_attempts times, by kind",
            labels=["kind"],
        )
        for kind in sorted({*retried, *m.requeued_by_kind, *m.quarantined_by_kind}):
            requeued.add_metric([kind], m.requeued_by_kind[kind])
            quarantined.add_metric([kind], m.quarantined_by_kind[kind])
        yield requeued
        yield quarantined


def install_run_metrics(registry: CollectorRegistry, manager: RunManager) -> None:
    """Register the run collector on *registry*."""
    registry.register(_RunCollector(manager))
