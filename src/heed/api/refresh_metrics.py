"""Prometheus metrics of mental-model refreshes, read at scrape time.

- ``heed_mental_model_refresh_skipped_total{trigger}``: refreshes this process skipped
  without an LLM call because the model's sources had not changed since its last refresh
  (:mod:`heed.mental_models.fingerprint`), by what asked for them (``created``, ``manual``,
  ``trigger``). Every trigger has its series from the start (at 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from heed.mental_models.refresh import MentalModelRefreshes

__all__ = ["TRIGGERS", "install_refresh_metrics"]

#: What asks for a refresh: its creation, a person (``POST .../refresh``), a trigger.
TRIGGERS: Final = ("created", "manual", "trigger")


class _RefreshCollector(Collector):
    def __init__(self, refreshes: MentalModelRefreshes) -> None:
        self._refreshes = refreshes

    def collect(self) -> Iterator[CounterMetricFamily]:
        skipped = CounterMetricFamily(
            "heed_mental_model_refresh_skipped",
            "Mental-model refreshes skipped without an LLM call because the model's sources"
            " had not changed since its last refresh, by trigger",
            labels=["trigger"],
        )
        counts = self._refreshes.skipped()
        for trigger in sorted({*TRIGGERS, *counts}):
            skipped.add_metric([trigger], counts.get(trigger, 0))
        yield skipped


def install_refresh_metrics(registry: CollectorRegistry, refreshes: MentalModelRefreshes) -> None:
    """Register the refresh collector on *registry*."""
    registry.register(_RefreshCollector(refreshes))
