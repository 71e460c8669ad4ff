"""Connection limits: a bounded request head and timeouts the client cannot hold open.

uvicorn's httptools protocol (the fast one heed serves with) has no limit on a request's
head and buffers a long header quadratically (one 150 MB header cost 19 s of a core), and
neither of uvicorn's protocols times out a connection before its first request, inside its
headers or inside a body: its only timer is keep-alive, between requests. A client that
opens sockets and says nothing held file descriptors until the process had none left.

:class:`GuardedHttpToolsProtocol` is uvicorn's httptools protocol with four bounds:

- **the head** (request line and headers) may not pass ``max_head_bytes``: past it the
  client gets ``431`` and the connection closes, so at most one read beyond the limit is
  ever buffered;
- **the head must arrive** within ``head_timeout`` seconds of the connection opening (or of
  the previous response, for the next request on a kept-alive connection): else ``408``
  and close, which is also what an idle connection that never sent a request gets;
- **a body may not stall**: a gap of ``body_timeout`` seconds with no body data while the
  server is ready to read closes the connection; the request's ``receive`` then reports a
  disconnect, so its work is cancelled like any abandoned request's (499 in the logs);
- **idle keep-alive** connections close after ``keep_alive_timeout`` (uvicorn's own timer).

Why a subclass and not another server or protocol: uvicorn's h11 protocol bounds the head
(``h11_max_incomplete_event_size``) but times out nothing and parses several times slower,
which the abandoned-request storm measured as most of what a request costs; Hypercorn
and Granian bound and time out natively but would replace the server under heed's drain
(:mod:`heed.api.server`). The subclass adds timers and a byte count on top of uvicorn's
parser callbacks and changes nothing else.
"""

from __future__ import annotations

import asyncio
import http
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "ConnectionLimits",
    "GuardedHttpToolsProtocol",
    "guarded_protocol",
    "raise_open_files_limit",
]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds of :class:`GuardedHttpToolsProtocol` (see the module docstring)."""

    max_head_bytes: int = 64 * 1024
    head_timeout: float = 10.0
    body_timeout: float = 30.0


def _response(status: int, message: str) -> bytes:
    body = message.encode("ascii")
    phrase = http.HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode("ascii") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head and timeouts (module docstring).

    Use :func:`guarded_protocol` to get a subclass bound to a :class:`ConnectionLimits`.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # -- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._in_head
            and self._head_bytes > self.limits.max_head_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(
                431,
                f"the request line and headers exceed {self.limits.max_head_bytes} bytes",
            )

    # -- parser callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # the next request on a kept-alive connection
            self._in_head = True
            self._head_bytes = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        self._arm_body_timer()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm_body_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- timers ---------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_timed_out)

    def _arm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
        self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered; its own head arrived in time
        self._refuse(
            408, f"the request line and headers did not arrive within {self.limits.head_timeout} s"
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:
            # The app has not read what it has (uvicorn paused reading): not the client's stall.
            self._arm_body_timer()
            return
        # The request's task is running; closing tells its receive() the client is gone,
        # which cancels its work and gives back its admission place.
        self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        self._cancel_timers()
        self.transport.write(_response(status, message))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` class bound to *limits* (for ``uvicorn.Config``)."""
    return type("HeedHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new soft limit.

    Each connection is a file descriptor, and the soft limit is often 1,024: past it the
    server cannot accept even a health check. The timeouts above bound how long a silent
    client keeps one; this bounds how soon a crowd of them would run out.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft
