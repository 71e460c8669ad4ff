"""Draining for shutdown: stop admitting, end the streams, cancel what is left.

One :class:`Drain` per app. The lifecycle middleware asks :attr:`Drain.draining`
before admitting a request (503 with ``Retry-After`` once it is set) and tracks
the token of every request in flight. Long-lived stream sources (the session
channel) watch :attr:`Drain.token`, which is cancelled when draining starts, so
they can send their last frame and end on their own.

:func:`heed.api.server.drain_app` runs the sequence on SIGTERM, before uvicorn
waits for connections: see ``docs/security.md`` and the run-state contract.
"""

from __future__ import annotations

from typing import Final

from heed.runtime.cancellation import CancellationToken

__all__ = ["SHUTDOWN_REASON", "Drain"]

SHUTDOWN_REASON: Final = "shutdown"


class Drain:
    """The server's drain state: a flag, a token streams watch, the requests in flight."""

    def __init__(self) -> None:
        self.token = CancellationToken()
        self._in_flight: set[CancellationToken] = set()

    @property
    def draining(self) -> bool:
        """True once :meth:`begin` ran: no new request is admitted."""
        return self.token.cancelled

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def track(self, token: CancellationToken) -> None:
        self._in_flight.add(token)

    def untrack(self, token: CancellationToken) -> None:
        self._in_flight.discard(token)

    def begin(self) -> None:
        """Stop admitting and tell stream sources to finish (idempotent)."""
        self.token.cancel(SHUTDOWN_REASON)

    def cancel_in_flight(self) -> int:
        """Cancel every request still in flight with reason ``shutdown``; how many."""
        tokens = list(self._in_flight)
        for token in tokens:
            token.cancel(SHUTDOWN_REASON)
        return len(tokens)
