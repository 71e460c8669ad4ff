"""The request lifecycle middleware: identity, the request token, and disconnects.

A pure ASGI middleware installed outermost, so that nothing can hide the
client's ``http.disconnect`` from it (Starlette's ``BaseHTTPMiddleware`` does
exactly that to everything inside it). For each HTTP request it:

1. refuses new work while the server drains for shutdown (503, ``Retry-After``), and a
   path or query string holding NUL (400, :func:`heed.api.input_rules.url_problem`);
2. authenticates (:mod:`heed.api.auth`: bearer key, UI cookie, Host allow-list), after
   the key-guessing throttle (:mod:`heed.api.throttle`: 429 for an address that failed
   too often; every 401 counts against it);
3. admits it (:mod:`heed.api.admission`): past the in-flight bound, in total or for the
   caller's tenant, it is refused with 503 and ``Retry-After`` before its body is read,
   and it takes its place only once the body has arrived, so a client that never sends
   its body holds no place; the place is given back when the response starts. Callers
   without credentials on public paths have an admission of their own;
4. reads the body, answering 413 once it passes ``max_body_bytes``, and 400 when
   it breaks the text rule (:mod:`heed.api.input_rules`); an upload (a multipart body to a
   path ``upload_paths`` matches: a bank archive's import) may reach ``max_upload_bytes``
   and is spooled to a temporary file past :data:`SPOOL_IN_MEMORY` bytes, not held in
   memory, then handed to the app a :data:`UPLOAD_CHUNK` at a time;
5. creates the request's :class:`~heed.runtime.CancellationToken` and
   :class:`~heed.runtime.RequestContext` and makes it the active context;
6. owns ``receive``: a watcher task waits for ``http.disconnect`` and cancels the
   token the moment it arrives (no polling), and the app's own ``receive``
   calls are served from what the watcher read;
7. records the outcome: ``OperationCancelled`` escaping the app becomes 499,
   which is logged with its reason and counted as a cancellation, not a failure.

Every response carries the security headers (:data:`SECURITY_HEADERS`: no framing, a
same-origin content policy, ``nosniff``). ``HEAD`` is answered as ``GET`` without the
body (uvicorn drops it); a streaming response is ended after its first chunk.

Routes opt out of cancel-on-disconnect with
:func:`heed.api.policies.continue_on_disconnect`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
import time
from typing import IO, Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.api.admission import Admission, Ticket
from heed.api.auth import ANONYMOUS_TENANT, Authenticator, Identity, Refusal
from heed.api.drain import Drain
from heed.api.input_rules import OFFLOAD_BODY_BYTES, body_problem, url_problem
from heed.api.metrics import Metrics
from heed.api.revocations import Revocations
from heed.api.throttle import FailureThrottle
from heed.runtime import OperationCancelled, RequestContext, run_in_thread, settle, use_context
from heed.runtime.cancellation import CancellationToken

__all__ = ["CLIENT_DISCONNECTED", "SECURITY_HEADERS", "RequestLifecycleMiddleware"]

CLIENT_DISCONNECTED: Final = "client disconnected"
STATUS_CLIENT_CLOSED: Final = 499
#: Cheap answers that must stay available under any load (load balancers, scrapers).
_NOT_ADMITTED: Final = frozenset({"/health", "/metrics"})
HEAD_ANSWERED: Final = "HEAD answered"
#: An upload's bytes kept in memory before it is spooled to disk.
SPOOL_IN_MEMORY: Final = 8 * 1024 * 1024
#: What the app's ``receive`` gets of a spooled upload at a time.
UPLOAD_CHUNK: Final = 1024 * 1024

#: On every response. The UI loads nothing from another origin and runs no inline script
#: or style, so its policy can be ``'self'`` throughout; no page of heed may be framed.
SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        b"form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)

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


def _header(scope: Scope, name: bytes) -> bytes:
    """The request header *name* (lower-case), lower-cased; empty when absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).lower()
    return b""


def _detail(message: str) -> str:
    return json.dumps({"detail": message})


class _BodyTooLarge(Exception):
    pass


def _leaving_on_start(send: Send, gate: Admission, ticket: Ticket) -> Send:
    """*send* that gives *ticket*'s place back as the response starts."""

    async def send_then_leave(message: Message) -> None:
        if message["type"] == "http.response.start":
            gate.leave(ticket)  # answering: no longer the expensive part
        await send(message)

    return send_then_leave


def _head_only(send: Send, token: CancellationToken) -> Send:
    """*send* for a HEAD request: the head and an empty body; a longer (streaming) body
    ends there and its work is cancelled."""
    finished = False

    async def send_head(message: Message) -> None:
        nonlocal finished
        if message["type"] != "http.response.body":
            await send(message)
            return
        if finished:
            return
        finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if message.get("more_body", False):
            token.cancel(HEAD_ANSWERED)

    return send_head


class _ReceiveOwner:
    """Reads the request body (into memory, or with *spool* into a temporary file), then
    watches the connection for a disconnect."""

    def __init__(
        self, receive: Receive, token: CancellationToken, limit: int, *, spool: bool = False
    ) -> None:
        self._receive = receive
        self._token = token
        self._limit = limit
        self._body_messages: list[Message] = []
        # Closed by close(), which the middleware calls when the request is done.
        self._spool: IO[bytes] | None = (
            tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
            if spool
            else None
        )
        self._spooled_left = 0
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
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                raise _BodyTooLarge
            if self._spool is not None:
                self._spool.write(chunk)  # a page-cache write: microseconds a chunk
            else:
                self._body_messages.append(message)
            if not message.get("more_body", False):
                if self._spool is not None:
                    self._spool.seek(0)
                    self._spooled_left = size
                else:
                    self.body = b"".join(m.get("body", b"") for m in self._body_messages)
                return True

    def close(self) -> None:
        """Drop a spooled body (its temporary file)."""
        if self._spool is not None:
            self._spool.close()

    def start_watching(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name="heed-disconnect-watcher")

    async def stop_watching(self) -> None:
        """Stop the watcher and return once it has finished (:func:`heed.runtime.settle`)."""
        if self._watcher is not None:
            await settle(self._watcher)

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
        if self._spool is not None and self._spooled_left > 0:
            chunk = self._spool.read(min(UPLOAD_CHUNK, self._spooled_left))
            self._spooled_left -= len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": self._spooled_left > 0}
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
        max_upload_bytes: int | None = None,
        upload_paths: re.Pattern[str] | None = None,
        drain: Drain | None = None,
        admission: Admission | None = None,
        public_admission: Admission | None = None,
        throttle: FailureThrottle | None = None,
        revocations: Revocations | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max(max_upload_bytes or max_body_bytes, max_body_bytes)
        self.upload_paths = upload_paths
        self.drain = drain or Drain()
        self.admission = admission
        self.public_admission = public_admission or (
            Admission(16) if admission is not None else None
        )
        self.throttle = throttle or FailureThrottle()
        self.revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = time.perf_counter()
        status_holder: dict[str, Any] = {"status": None}
        if scope["method"] == "HEAD":  # routed as GET; uvicorn leaves out the body
            scope = {**scope, "method": "GET"}
            status_holder["head"] = True

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *SECURITY_HEADERS]}
            await send(message)

        client = scope.get("client")
        address = client[0] if client else None
        try:
            await self._handle(scope, receive, send_recording, status_holder, address)
        finally:
            self._record(scope, status_holder, time.perf_counter() - started)
            if status_holder["status"] == 401:
                self.throttle.failed(address)

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status_holder: dict[str, Any],
        address: str | None,
    ) -> None:
        if self.drain.draining:
            await _send_json(
                send, 503, _detail("the server is shutting down"), [(b"retry-after", b"1")]
            )
            return
        problem = url_problem(scope.get("path", ""), scope.get("query_string", b""))
        if problem is not None:
            await _send_json(send, 400, _detail(problem), [])
            return
        path = scope.get("path", "")
        headers = scope.get("headers", [])
        if self._authenticates(scope["method"], path, headers):
            wait = self.throttle.retry_after(address)
            if wait is not None:
                message = "too many failed authentications from this address; try again later"
                await _send_json(send, 429, _detail(message), [(b"retry-after", b"%d" % wait)])
                return
        identity = self.authenticator.identify(scope["method"], path, headers, address)
        if isinstance(identity, Refusal):
            headers = [(b"www-authenticate", b"Bearer")] if identity.status == 401 else []
            await _send_json(send, identity.status, _detail(identity.message), headers)
            return
        gate = self._gate(path, identity)
        if gate is not None:
            refused = gate.refusal(identity.tenant)
            if refused is not None:
                self.metrics.record_overload("in_flight")
                await _send_json(send, 503, _detail(refused), [(b"retry-after", b"1")])
                return
        await self._admitted(scope, receive, send, status_holder, identity, gate)

    def _gate(self, path: str, identity: Identity) -> Admission | None:
        """The admission that counts this request, or None when it is not counted."""
        if self.admission is None or path in _NOT_ADMITTED:
            return None
        if identity.tenant == ANONYMOUS_TENANT and self.authenticator.keys_required:
            return self.public_admission
        return self.admission

    @staticmethod
    def _authenticates(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the request tries a key (a bearer header or a login): what is throttled."""
        if method == "POST" and path == "/v1/auth/login":
            return True
        return any(name == b"authorization" for name, _ in headers)

    async def _admitted(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status_holder: dict[str, Any],
        identity: Identity,
        gate: Admission | None,
    ) -> None:
        upload = self._is_upload(scope)
        limit = self.max_upload_bytes if upload else self.max_body_bytes
        if self._declared_length(scope) > limit:
            await _send_json(send, 413, _detail(self._too_large_message(upload)), [])
            return

        token = CancellationToken()
        ctx = RequestContext(tenant=identity.tenant, principal=identity.principal, token=token)
        scope.setdefault("state", {})["request_context"] = ctx
        owner = _ReceiveOwner(receive, token, limit, spool=upload)
        try:
            await self._read_and_run(scope, send, status_holder, identity, gate, owner, ctx)
        except _BodyTooLarge:
            await _send_json(send, 413, _detail(self._too_large_message(upload)), [])
        finally:
            owner.close()

    def _is_upload(self, scope: Scope) -> bool:
        """Whether the request is an upload (see the module docstring)."""
        return (
            self.upload_paths is not None
            and scope["method"] == "POST"
            and self.upload_paths.fullmatch(scope.get("path", "")) is not None
            and _header(scope, b"content-type").startswith(b"multipart/form-data")
        )

    async def _read_and_run(
        self,
        scope: Scope,
        send: Send,
        status_holder: dict[str, Any],
        identity: Identity,
        gate: Admission | None,
        owner: _ReceiveOwner,
        ctx: RequestContext,
    ) -> None:
        if not await owner.read_body():
            status_holder["status"] = STATUS_CLIENT_CLOSED
            status_holder["reason"] = CLIENT_DISCONNECTED
            return
        if identity.session_id is not None and self.revocations is not None:
            with use_context(ctx):
                revoked = await self.revocations.is_revoked(identity.session_id)
            if revoked:
                message = "the UI session has ended (logged out); log in again"
                await _send_json(send, 401, _detail(message), [])
                return
        ticket = gate.enter(identity.tenant) if gate is not None else None
        if isinstance(ticket, str):
            self.metrics.record_overload("in_flight")
            await _send_json(send, 503, _detail(ticket), [(b"retry-after", b"1")])
            return
        if ticket is not None and gate is not None:
            send = _leaving_on_start(send, gate, ticket)
        if status_holder.get("head"):
            send = _head_only(send, ctx.token)
        try:
            await self._run_app(scope, send, status_holder, owner, ctx)
        finally:
            if ticket is not None and gate is not None:
                gate.leave(ticket)

    async def _run_app(
        self,
        scope: Scope,
        send: Send,
        status_holder: dict[str, Any],
        owner: _ReceiveOwner,
        ctx: RequestContext,
    ) -> None:
        token = ctx.token
        # A multipart body carries files (binary); the file route checks its text fields.
        multipart = _header(scope, b"content-type").startswith(b"multipart/form-data")
        problem = None if multipart else await self._body_problem(owner.body, ctx)
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
        if len(body) < OFFLOAD_BODY_BYTES:
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

    def _too_large_message(self, upload: bool = False) -> str:
        if upload:
            return (
                f"upload exceeds the limit of {self.max_upload_bytes} bytes "
                "(the server's HEED_MAX_UPLOAD_BYTES)"
            )
        return (
            f"request body exceeds the limit of {self.max_body_bytes} bytes "
            "(the server's HEED_MAX_BODY_BYTES)"
        )

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
