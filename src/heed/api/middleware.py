"""The request lifecycle middleware: identity, the request token, and disconnects.

A pure ASGI middleware installed outermost, so that nothing can hide the
client's ``http.disconnect`` from it (Starlette's ``BaseHTTPMiddleware`` does
exactly that to everything inside it). For each HTTP request it:

1. refuses new work while the server drains for shutdown (503, ``Retry-After``);
2. authenticates (:mod:`heed.api.auth`: bearer key, UI cookie, Host allow-list);
3. admits it (:mod:`heed.api.admission`): past the in-flight bound, in total or for the
   caller's tenant, it is refused with 503 and ``Retry-After`` before its body is read;
   the place is given back when the response starts;
4. reads the body, answering 413 once it passes ``max_body_bytes``, and 400 when
   it breaks the text rule (:mod:`heed.api.input_rules`);
5. creates the request's :class:`~heed.runtime.CancellationToken` and
   :class:`~heed.runtime.RequestContext` and makes it the active context;
6. owns ``receive``: a watcher task waits for ``http.disconnect`` and cancels the
   token the moment it arrives (no polling), and the app's own ``receive``
   calls are served from what the watcher read;
7. records the outcome: ``OperationCancelled`` escaping the app becomes 499,
   which is logged with its reason and counted as a cancellation, not a failure.

Routes opt out of cancel-on-disconnect with
:func:`heed.api.policies.continue_on_disconnect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.api.admission import Admission
from heed.api.auth import Authenticator, Identity, Refusal
from heed.api.drain import Drain
from heed.api.input_rules import body_problem
from heed.api.metrics import Metrics
from heed.runtime import OperationCancelled, RequestContext, run_in_thread, use_context
from heed.runtime.cancellation import CancellationToken

__all__ = ["CLIENT_DISCONNECTED", "RequestLifecycleMiddleware"]

CLIENT_DISCONNECTED: Final = "client disconnected"
STATUS_CLIENT_CLOSED: Final = 499
_OFFLOAD_BODY_BYTES: Final = 64 * 1024
#: Cheap answers that must stay available under any load (load balancers, scrapers).
_NOT_ADMITTED: Final = frozenset({"/health", "/metrics"})

log = logging.getLogger("heed.http")


async def _send_json(
    send: Send, status: int, body: str, headers: list[tuple[bytes, bytes]]
) -> None:
    payload = body.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _detail(message: str) -> str:
    return json.dumps({"detail": message})


class _BodyTooLarge(Exception):
    pass


class _ReceiveOwner:
    """Reads the request body, then watches the connection for a disconnect."""

    def __init__(self, receive: Receive, token: CancellationToken, limit: int) -> None:
        self._receive = receive
        self._token = token
        self._limit = limit
        self._body_messages: list[Message] = []
        self.body = b""
        self._disconnected = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected_at: float | None = None

    async def read_body(self) -> bool:
        """Buffer the whole body; False if the client left while sending it."""
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._mark_disconnected()
                return False
            size += len(message.get("body", b""))
            if size > self._limit:
                raise _BodyTooLarge
            self._body_messages.append(message)
            if not message.get("more_body", False):
                self.body = b"".join(m.get("body", b"") for m in self._body_messages)
                return True

    def start_watching(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name="heed-disconnect-watcher")

    async def stop_watching(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._mark_disconnected()
                return

    def _mark_disconnected(self) -> None:
        self.disconnected_at = time.monotonic()
        self._disconnected.set()
        self._token.cancel(CLIENT_DISCONNECTED)

    async def receive(self) -> Message:
        """The ``receive`` the app sees: the buffered body, then the disconnect."""
        if self._body_messages:
            return self._body_messages.pop(0)
        await self._disconnected.wait()
        return {"type": "http.disconnect"}


class RequestLifecycleMiddleware:
    """See the module docstring. Install with ``app.add_middleware`` last (outermost)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        authenticator: Authenticator,
        max_body_bytes: int,
        drain: Drain | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes
        self.drain = drain or Drain()
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = time.perf_counter()
        status_holder: dict[str, Any] = {"status": None}

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, send_recording, status_holder)
        finally:
            self._record(scope, status_holder, time.perf_counter() - started)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, status_holder: dict[str, Any]
    ) -> None:
        if self.drain.draining:
            await _send_json(
                send, 503, _detail("the server is shutting down"), [(b"retry-after", b"1")]
            )
            return
        client = scope.get("client")
        identity = self.authenticator.identify(
            scope.get("method", ""),
            scope.get("path", ""),
            scope.get("headers", []),
            client[0] if client else None,
        )
        if isinstance(identity, Refusal):
            headers = [(b"www-authenticate", b"Bearer")] if identity.status == 401 else []
            await _send_json(send, identity.status, _detail(identity.message), headers)
            return
        if self.admission is None or scope.get("path") in _NOT_ADMITTED:
            await self._admitted(scope, receive, send, status_holder, identity)
            return
        ticket = self.admission.enter(identity.tenant)
        if isinstance(ticket, str):
            self.metrics.record_overload("in_flight")
            await _send_json(send, 503, _detail(ticket), [(b"retry-after", b"1")])
            return
        admission = self.admission

        async def send_then_leave(message: Message) -> None:
            if message["type"] == "http.response.start":
                admission.leave(ticket)  # answering: no longer the expensive part
            await send(message)

        try:
            await self._admitted(scope, receive, send_then_leave, status_holder, identity)
        finally:
            admission.leave(ticket)

    async def _admitted(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status_holder: dict[str, Any],
        identity: Identity,
    ) -> None:
        if self._declared_length(scope) > self.max_body_bytes:
            await _send_json(send, 413, _detail(self._too_large_message()), [])
            return

        token = CancellationToken()
        ctx = RequestContext(tenant=identity.tenant, principal=identity.principal, token=token)
        scope.setdefault("state", {})["request_context"] = ctx
        owner = _ReceiveOwner(receive, token, self.max_body_bytes)
        try:
            if not await owner.read_body():
                status_holder["status"] = STATUS_CLIENT_CLOSED
                status_holder["reason"] = CLIENT_DISCONNECTED
                return
        except _BodyTooLarge:
            await _send_json(send, 413, _detail(self._too_large_message()), [])
            return
        problem = await self._body_problem(owner.body, ctx)
        if problem is not None:
            await _send_json(send, 400, _detail(problem), [])
            return

        owner.start_watching()
        self.drain.track(token)
        try:
            with use_context(ctx):
                await self.app(scope, owner.receive, send)
        except OperationCancelled as exc:
            status_holder["reason"] = exc.reason
            if status_holder["status"] is None:
                await _send_json(
                    send, STATUS_CLIENT_CLOSED, _detail(f"cancelled: {exc.reason}"), []
                )
        finally:
            self.drain.untrack(token)
            await owner.stop_watching()
        if status_holder["status"] == STATUS_CLIENT_CLOSED and "reason" not in status_holder:
            status_holder["reason"] = scope["state"].get("cancel_reason") or token.reason

    @staticmethod
    async def _body_problem(body: bytes, ctx: RequestContext) -> str | None:
        if len(body) < _OFFLOAD_BODY_BYTES:
            return body_problem(body)
        with use_context(ctx):  # a large body is parsed off the loop
            return await run_in_thread(body_problem, body)

    @staticmethod
    def _declared_length(scope: Scope) -> int:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return 0
        return 0

    def _too_large_message(self) -> str:
        return f"request body exceeds the limit of {self.max_body_bytes} bytes"

    def _record(self, scope: Scope, status_holder: dict[str, Any], seconds: float) -> None:
        status = status_holder["status"] or 500
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        method = scope.get("method", "")
        self.metrics.record_request(method, template, status, seconds)
        if status == STATUS_CLIENT_CLOSED:
            reason = str(status_holder.get("reason") or "unknown")
            self.metrics.record_cancellation(reason)
            log.info("%s %s cancelled (499): %.200s", method, scope.get("path"), reason)
        elif status >= 500 and status != 503:
            self.metrics.failures.labels(template).inc()
