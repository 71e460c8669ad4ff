"""Prometheus metrics for one server: HTTP outcomes, cancellations and lane counters.

Each app gets its own ``CollectorRegistry`` so several apps (tests) never clash.

Every label comes from a fixed set, so no client can grow the series without
bound: methods outside the standard ones count as ``other``, requests that
match no route as ``unmatched``, and cancellation reasons (which a client can
choose, ``POST /v1/runs/{id}/cancel?reason=``) beyond the first
:data:`MAX_REASONS` distinct ones as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heed.runtime import Lanes

__all__ = ["KNOWN_METHODS", "MAX_REASONS", "Metrics"]

KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_REASONS: Final = 32
_REASON_CHARS: Final = 60


class _LaneCollector(Collector):
    """Reads the lanes' live counters at scrape time."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauges = {
            "capacity": GaugeMetricFamily("heed_lane_capacity", "Slots per lane", labels=["lane"]),
            "in_use": GaugeMetricFamily(
                "heed_lane_in_use", "Slots held by running work", labels=["lane"]
            ),
            "queued": GaugeMetricFamily(
                "heed_lane_queued", "Work waiting for a slot", labels=["lane"]
            ),
            "abandoned": GaugeMetricFamily(
                "heed_lane_abandoned",
                "Slots held by cancelled work that has not stopped yet",
                labels=["lane"],
            ),
        }
        rejected = CounterMetricFamily(
            "heed_lane_rejected", "Work rejected because the queue was full", labels=["lane"]
        )
        dequeued = CounterMetricFamily(
            "heed_lane_cancelled_in_queue",
            "Work cancelled while queued (it never started)",
            labels=["lane"],
        )
        for lane in self._lanes.all():
            stats = lane.stats()
            gauges["capacity"].add_metric([stats.name], stats.capacity)
            gauges["in_use"].add_metric([stats.name], stats.in_use)
            gauges["queued"].add_metric([stats.name], stats.queued)
            gauges["abandoned"].add_metric([stats.name], stats.abandoned)
            rejected.add_metric([stats.name], stats.rejected_total + stats.shed_total)
            dequeued.add_metric([stats.name], stats.cancelled_in_queue_total)
        yield from gauges.values()
        yield rejected
        yield dequeued


class Metrics:
    """The metric objects the HTTP layer and the engine update."""

    def __init__(self, lanes: Lanes) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "heed_http_requests",
            "HTTP requests by route template and status (499: the client left first)",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "heed_http_request_duration_seconds",
            "HTTP request duration by route template",
            ["route"],
            registry=self.registry,
        )
        self.cancellations = Counter(
            "heed_cancellations",
            "Work stopped by cancellation, by reason; never counted as a failure",
            ["reason"],
            registry=self.registry,
        )
        self.failures = Counter(
            "heed_http_server_errors",
            "Requests that ended in a server error (5xx other than 503)",
            ["route"],
            registry=self.registry,
        )
        self.overload = Counter(
            "heed_overload_refusals",
            "Requests refused with 503 before any work: in_flight (the edge bound) or lane "
            "(a lane shed them: full, or its expected wait too long)",
            ["where"],
            registry=self.registry,
        )
        self.registry.register(_LaneCollector(lanes))
        self._reasons: set[str] = set()

    def record_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one request; *route* is its template (``unmatched`` when none matched)."""
        method = method if method in KNOWN_METHODS else "other"
        status = status if 100 <= status <= 599 else 500
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def record_overload(self, where: str) -> None:
        """Count one request refused for load (``in_flight`` or ``lane``)."""
        self.overload.labels(where).inc()

    def record_cancellation(self, reason: str) -> None:
        """Count one cancellation by reason (folded to ``other`` past the bound)."""
        reason = reason[:_REASON_CHARS]
        if reason not in self._reasons:
            if len(self._reasons) >= MAX_REASONS:
                reason = "other"
            else:
                self._reasons.add(reason)
        self.cancellations.labels(reason).inc()
