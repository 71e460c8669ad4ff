"""The request lifecycle middleware: identity, the request token, and disconnects.

A pure ASGI middleware installed outermost, so that nothing can hide the
client's ``http.disconnect`` from it (Starlette's ``BaseHTTPMiddleware`` does
exactly that to everything inside it). For each HTTP request it:

1. authenticates (``Authorization: Bearer``) and resolves the tenant;
2. reads the body, answering 413 once it passes ``max_body_bytes``;
3. creates the request's :class:`~heed.runtime.CancellationToken` and
   :class:`~heed.runtime.RequestContext` and makes it the active context;
4. owns ``receive``: a watcher task waits for ``http.disconnect`` and cancels the
   token the moment it arrives (no polling), and the app's own ``receive``
   calls are served from what the watcher read;
5. records the outcome: ``OperationCancelled`` escaping the app becomes 499,
   which is logged with its reason and counted as a cancellation, not a failure.

Routes opt out of cancel-on-disconnect with
:func:`heed.api.policies.continue_on_disconnect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.api.metrics import Metrics
from heed.runtime import DEFAULT_TENANT, OperationCancelled, RequestContext, use_context
from heed.runtime.cancellation import CancellationToken

__all__ = ["CLIENT_DISCONNECTED", "RequestLifecycleMiddleware"]

CLIENT_DISCONNECTED: Final = "client disconnected"
STATUS_CLIENT_CLOSED: Final = 499

log = logging.getLogger("heed.http")


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in {"localhost", "testclient"}


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


@dataclass(frozen=True, slots=True)
class _Refusal:
    status: int
    message: str


class _BodyTooLarge(Exception):
    pass


class _ReceiveOwner:
    """Reads the request body, then watches the connection for a disconnect."""

    def __init__(self, receive: Receive, token: CancellationToken, limit: int) -> None:
        self._receive = receive
        self._token = token
        self._limit = limit
        self._body_messages: list[Message] = []
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
        api_keys: dict[str, str],
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.api_keys = api_keys
        self.max_body_bytes = max_body_bytes

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
        identity = self._authenticate(scope)
        if isinstance(identity, _Refusal):
            headers = [(b"www-authenticate", b"Bearer")] if identity.status == 401 else []
            await _send_json(send, identity.status, _detail(identity.message), headers)
            return
        tenant, principal = identity

        if self._declared_length(scope) > self.max_body_bytes:
            await _send_json(send, 413, _detail(self._too_large_message()), [])
            return

        token = CancellationToken()
        ctx = RequestContext(tenant=tenant, principal=principal, token=token)
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

        owner.start_watching()
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
            await owner.stop_watching()
        if status_holder["status"] == STATUS_CLIENT_CLOSED and "reason" not in status_holder:
            status_holder["reason"] = scope["state"].get("cancel_reason") or token.reason

    def _authenticate(self, scope: Scope) -> tuple[str, str | None] | _Refusal:
        """(tenant, principal), or why the request is refused."""
        if not self.api_keys:
            client = scope.get("client")
            if client is not None and not _is_loopback(client[0]):
                return _Refusal(
                    403,
                    "this server has no API keys configured and serves loopback clients only; "
                    "set HEED_API_KEYS to accept remote clients",
                )
            return (DEFAULT_TENANT, None)
        header = ""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return _Refusal(401, "missing Authorization: Bearer <key> header")
        tenant = self.api_keys.get(key.strip())
        if tenant is None:
            return _Refusal(401, "unknown API key")
        principal = "key:" + hashlib.sha256(key.strip().encode()).hexdigest()[:12]
        return (tenant, principal)

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
        self.metrics.requests.labels(method, template, str(status)).inc()
        self.metrics.latency.labels(template).observe(seconds)
        if status == STATUS_CLIENT_CLOSED:
            reason = str(status_holder.get("reason") or "unknown")[:60]
            self.metrics.cancellations.labels(reason).inc()
            log.info("%s %s cancelled (499): %s", method, scope.get("path"), reason)
        elif status >= 500 and status != 503:
            self.metrics.failures.labels(template).inc()
