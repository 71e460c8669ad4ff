"""Watching LLM retries and failures: nothing a provider retries or gives up on is silent.

An :class:`LlmObserver` is a pair of callbacks:

- ``on_retry(provider, status, reason, delay)``: a call failed transiently and
  is about to be tried again after *delay* seconds (called before the sleep);
- ``on_failure(provider, status, reason)``: a call gave up with a
  :class:`~heed.llm.base.ProviderError`.

*provider* is the provider's name (``openai``...), *status* the upstream's HTTP
status when there was one (429, 503...) else ``None``, *reason* one of a few
fixed words, fit for a metric label:

==================  ===============================================================
``rate_limited``    upstream answered 429
``upstream_error``  upstream answered 5xx, or sent an error event mid-stream
``unreachable``     no connection, or no answer in time
``stream_broken``   the stream broke, stalled or ended before finishing
``refused``         upstream refused the request (another 4xx)
``unknown_model``   upstream does not serve the model
``bad_output``      the stream or a tool call's arguments were malformed
``invalid_json``    :func:`~heed.llm.structured.complete_json`: the reply is not JSON
``schema_violation``  :func:`~heed.llm.structured.complete_json`: it breaks the schema
==================  ===============================================================

Who is told: every observer made current with :func:`observing` in the calling
context (nested ones all, innermost last; a task or ``run_in_thread`` started
inside inherits them with the context), then every process-wide observer added
with :func:`add_global_observer` (the composition root counts metrics there;
this package imports neither prometheus nor the API layer). Each event is also
logged at WARNING on ``heed.llm`` with its detail.

A cancellation is neither a retry nor a failure and is never reported. An
observer that raises is logged and ignored: watching a call never breaks it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from heed.llm.hooks import Hooks
from heed.runtime import reraise_cancellation

__all__ = [
    "FAILURE_REASONS",
    "RETRY_REASONS",
    "LlmObserver",
    "add_global_observer",
    "current_observers",
    "notify_failure",
    "notify_retry",
    "observing",
    "remove_global_observer",
]

log = logging.getLogger("heed.llm")

RETRY_REASONS: Final = frozenset(
    {"rate_limited", "upstream_error", "unreachable", "invalid_json", "schema_violation"}
)
FAILURE_REASONS: Final = RETRY_REASONS | {
    "stream_broken",
    "refused",
    "unknown_model",
    "bad_output",
}

RetryCallback = Callable[[str, "int | None", str, float], None]
FailureCallback = Callable[[str, "int | None", str], None]


def _ignore_retry(provider: str, status: int | None, reason: str, delay: float) -> None:
    return None


def _ignore_failure(provider: str, status: int | None, reason: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class LlmObserver:
    """Callbacks for LLM retries and failures; either may be left out (then a no-op).

    Callbacks run synchronously on the thread that reports (the event loop for
    the ``openai`` provider): keep them short, as counting a metric is.
    """

    on_retry: RetryCallback = _ignore_retry
    on_failure: FailureCallback = _ignore_failure


_context_observers: ContextVar[tuple[LlmObserver, ...]] = ContextVar(
    "heed_llm_observers", default=()
)
_global_observers: Hooks[LlmObserver] = Hooks()


@contextlib.contextmanager
def observing(observer: LlmObserver) -> Iterator[LlmObserver]:
    """Tell *observer* about retries and failures in this context until the block ends.

    Nested blocks add up: an inner observer does not hide an outer one.
    """
    reset = _context_observers.set((*_context_observers.get(), observer))
    try:
        yield observer
    finally:
        _context_observers.reset(reset)


def add_global_observer(observer: LlmObserver) -> None:
    """Tell *observer* about every retry and failure in this process, from now on."""
    _global_observers.add(observer)


def remove_global_observer(observer: LlmObserver) -> None:
    """Stop telling *observer* (added with :func:`add_global_observer`); no-op if absent."""
    _global_observers.remove(observer)


def current_observers() -> tuple[LlmObserver, ...]:
    """The observers an event reported now would reach: the context's, then the global."""
    return (*_context_observers.get(), *_global_observers.snapshot())


def notify_retry(
    provider: str, status: int | None, reason: str, delay: float, *, detail: str = ""
) -> None:
    """Report a retry about to happen after *delay* s (call it before sleeping)."""
    log.warning(
        "LLM %s: retrying in %.2f s (%s, upstream status %s): %s",
        provider,
        delay,
        reason,
        status,
        detail or "-",
    )
    for observer in current_observers():
        try:
            observer.on_retry(provider, status, reason, delay)
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("an LLM observer failed in on_retry")


def notify_failure(provider: str, status: int | None, reason: str, *, detail: str = "") -> None:
    """Report a call that gave up with a provider error."""
    log.warning(
        "LLM %s: failed (%s, upstream status %s): %s", provider, reason, status, detail or "-"
    )
    for observer in current_observers():
        try:
            observer.on_failure(provider, status, reason)
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("an LLM observer failed in on_failure")
