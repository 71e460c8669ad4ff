"""Prometheus metrics for one server: HTTP outcomes, cancellations, lane counters, LLM
retries and failures, and LLM calls and tokens.

Each app gets its own ``CollectorRegistry`` so several apps (tests) never clash.

Every label comes from a fixed set, so no client can grow the series without
bound: methods outside the standard ones count as ``other``, requests that
match no route as ``unmatched``, and cancellation reasons (which a client can
choose, ``POST /v1/runs/{id}/cancel?reason=``) beyond the first
:data:`MAX_REASONS` distinct ones as ``other``. LLM reasons are the fixed words
of :mod:`heed.llm.observe` (anything else: ``other``), providers the first
:data:`MAX_PROVIDERS` names seen. LLM tokens and calls are labelled by the fixed kinds of
work of :mod:`heed.llm.usage` (never by bank: a bank's tokens are in its stats).

**LLM retries and failures are counted per process.** Providers report them to
the observers of :mod:`heed.llm.observe`; one process-wide observer feeds
``heed_llm_retries_total`` and ``heed_llm_failures_total``, which every app's
registry exports; one process-wide call sink (:mod:`heed.llm.usage`) likewise feeds
``heed_llm_calls_total`` and ``heed_llm_tokens_total``. It is added while at least one app serves
(:meth:`Metrics.counting_llm`, held by the app's lifespan) and removed when the
last one stops, so however many apps a process builds (tests build one per
test) there is never more than one such observer, no event is counted twice,
and none is left behind by an app that stopped or never started.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heed.llm.observe import (
    FAILURE_REASONS,
    LlmObserver,
    add_global_observer,
    remove_global_observer,
)
from heed.llm.usage import KINDS, STATUSES, LlmCall, add_call_sink, remove_call_sink
from heed.runtime import Lane, Lanes

__all__ = ["KNOWN_METHODS", "MAX_PROVIDERS", "MAX_REASONS", "Metrics"]

KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_REASONS: Final = 32
MAX_PROVIDERS: Final = 8
_REASON_CHARS: Final = 60


class _LlmCounts:
    """The process's LLM retry and failure counters and the one observer that feeds them.

    The counters are collectors registered in every app's registry (a collector may sit in
    several registries); the observer is a global observer while more :meth:`acquire` than
    :meth:`release` calls were made (see the module docstring).
    """

    def __init__(self) -> None:
        self.retries = Counter(
            "heed_llm_retries",
            "LLM calls failed transiently and about to be tried again (this process), by "
            "provider and reason (rate_limited, upstream_error, unreachable: the upstream; "
            "invalid_json, schema_violation: a structured reply asked again)",
            ["provider", "reason"],
            registry=None,
        )
        self.failures = Counter(
            "heed_llm_failures",
            "LLM calls that gave up with a provider error (this process), by provider and "
            "reason (the retry reasons, and stream_broken, refused, unknown_model, bad_output)",
            ["provider", "reason"],
            registry=None,
        )
        self.tokens = Counter(
            "heed_llm_tokens",
            "LLM tokens (this process), by operation (the kind of work: reflect, turn, "
            "extraction, consolidation, mental_model_refresh, other) and kind (prompt, "
            "completion); the provider's reported usage, else counted by heed's tokenizer",
            ["operation", "kind"],
            registry=None,
        )
        self.calls = Counter(
            "heed_llm_calls",
            "LLM calls (this process), by operation (as heed_llm_tokens) and status (success, "
            "error, cancelled)",
            ["operation", "status"],
            registry=None,
        )
        self.observer = LlmObserver(on_retry=self._on_retry, on_failure=self._on_failure)
        self._lock = threading.Lock()
        self._holders = 0
        self._providers: set[str] = set()

    def _labels(self, provider: str, reason: str) -> tuple[str, str]:
        reason = reason if reason in FAILURE_REASONS else "other"
        provider = provider[:_REASON_CHARS]
        with self._lock:
            if provider not in self._providers:
                if len(self._providers) >= MAX_PROVIDERS:
                    provider = "other"
                else:
                    self._providers.add(provider)
        return provider, reason

    def _on_retry(self, provider: str, status: int | None, reason: str, delay: float) -> None:
        self.retries.labels(*self._labels(provider, reason)).inc()

    def _on_failure(self, provider: str, status: int | None, reason: str) -> None:
        self.failures.labels(*self._labels(provider, reason)).inc()

    def _on_call(self, call: LlmCall) -> None:
        operation = call.kind if call.kind in KINDS else "other"
        status = call.status if call.status in STATUSES else "error"
        self.calls.labels(operation, status).inc()
        self.tokens.labels(operation, "prompt").inc(call.prompt_tokens)
        self.tokens.labels(operation, "completion").inc(call.completion_tokens)

    def acquire(self) -> None:
        """One more app serves: the observer and the call sink are added by the first."""
        with self._lock:
            self._holders += 1
            if self._holders == 1:
                add_global_observer(self.observer)
                add_call_sink(self._on_call)

    def release(self) -> None:
        """One app stopped: the observer and the call sink are removed with the last."""
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                remove_global_observer(self.observer)
                remove_call_sink(self._on_call)


_LLM: Final = _LlmCounts()


class _LaneCollector(Collector):
    """Reads the lanes' live counters at scrape time: the server's lanes and the lanes of
    its remote LLM upstreams (``llm:openai``, :mod:`heed.llm.gate`), built as
    they are first used."""

    def __init__(self, lanes: Lanes, more: Callable[[], list[Lane]] | None = None) -> None:
        self._lanes = lanes
        self._more = more or list

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
        background = {
            "capacity": GaugeMetricFamily(
                "heed_lane_background_capacity",
                "The most slots background work may hold at once",
                labels=["lane"],
            ),
            "in_use": GaugeMetricFamily(
                "heed_lane_background_in_use",
                "Slots held by background work (part of heed_lane_in_use)",
                labels=["lane"],
            ),
            "queued": GaugeMetricFamily(
                "heed_lane_background_queued",
                "Background work waiting for a slot in its tenant's queue (not part of "
                "heed_lane_queued)",
                labels=["lane"],
            ),
            "deferred": GaugeMetricFamily(
                "heed_lane_background_deferred",
                "Background work deferred past its tenant's queue (HEED_BACKGROUND_MAX_QUEUE; "
                "not part of heed_lane_background_queued)",
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
        for lane in [*self._lanes.all(), *self._more()]:
            stats = lane.stats()
            gauges["capacity"].add_metric([stats.name], stats.capacity)
            gauges["in_use"].add_metric([stats.name], stats.in_use)
            gauges["queued"].add_metric([stats.name], stats.queued)
            gauges["abandoned"].add_metric([stats.name], stats.abandoned)
            background["capacity"].add_metric([stats.name], lane.background_capacity)
            background["in_use"].add_metric([stats.name], stats.background_in_use)
            background["queued"].add_metric([stats.name], stats.background_queued)
            background["deferred"].add_metric([stats.name], stats.background_deferred)
            rejected.add_metric([stats.name], stats.rejected_total + stats.shed_total)
            dequeued.add_metric([stats.name], stats.cancelled_in_queue_total)
        yield from gauges.values()
        yield from background.values()
        yield rejected
        yield dequeued


class Metrics:
    """The metric objects the HTTP layer and the engine update."""

    def __init__(self, lanes: Lanes, more_lanes: Callable[[], list[Lane]] | None = None) -> None:
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
        self.registry.register(_LaneCollector(lanes, more_lanes))
        self.registry.register(_LLM.retries)
        self.registry.register(_LLM.failures)
        self.registry.register(_LLM.tokens)
        self.registry.register(_LLM.calls)
        self._reasons: set[str] = set()

    @contextlib.contextmanager
    def counting_llm(self) -> Iterator[None]:
        """Count this process's LLM retries and failures while the block runs (the app's
        lifespan holds it); see the module docstring."""
        _LLM.acquire()
        try:
            yield
        finally:
            _LLM.release()

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
