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
   it breaks the text rule (:mod:`heed.api.input_rules`). An upload (a multipart body to a
   path ``upload_paths`` matches: a bank archive's import) is not read here: it may reach
   ``max_upload_bytes``; its bytes are claimed from the :class:`~heed.api.uploads.SpoolBudget`
   before anything is read (429 or 507 past a bound, :mod:`heed.api.uploads`) and the app
   runs at once, so the route checks the bank and its parameters first and then streams
   the body into the claim's one spool file itself; the request takes its admission place
   when the body has arrived, as any other, and the claim (its file, its bytes) is given
   back when the request ends, however it ends;
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
import time
from collections.abc import Callable
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.api.admission import Admission, Ticket
from heed.api.auth import ANONYMOUS_TENANT, Authenticator, Identity, Refusal
from heed.api.drain import Drain
from heed.api.input_rules import OFFLOAD_BODY_BYTES, body_problem, url_problem
from heed.api.metrics import Metrics
from heed.api.revocations import Revocations
from heed.api.throttle import FailureThrottle
from heed.api.uploads import STATE_KEY, SpoolBudget, SpoolClaim, UploadRefused
from heed.runtime import OperationCancelled, RequestContext, run_in_thread, settle, use_context
from heed.runtime.cancellation import CancellationToken

__all__ = ["CLIENT_DISCONNECTED", "SECURITY_HEADERS", "RequestLifecycleMiddleware"]

CLIENT_DISCONNECTED: Final = "client disconnected"
STATUS_CLIENT_CLOSED: Final = 499
#: Cheap answers that must stay available under any load (load balancers, scrapers).
_NOT_ADMITTED: Final = frozenset({"/health", "/health/live", "/health/ready", "/metrics"})
HEAD_ANSWERED: Final = "HEAD answered"

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


def _headers(refused: UploadRefused) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in refused.headers.items()]


def _close(claim: SpoolClaim) -> None:
    """Close an upload's claim: its spool file is deleted, its bytes given back."""
    try:
        claim.close()
    except OSError as exc:  # the file is unlinked already; its descriptor goes with it
        log.warning("could not close an upload's spool file: %s", exc)


class _BodyTooLarge(Exception):
    pass


def _leaving_on_start(send: Send, gate: Admission, ticket: Callable[[], Ticket | None]) -> Send:
    """*send* that gives the place of *ticket* (the request's, once it has one) back as
    the response starts."""

    async def send_then_leave(message: Message) -> None:
        if message["type"] == "http.response.start":
            held = ticket()
            if held is not None:
                gate.leave(held)  # answering: no longer the expensive part
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
    """Reads the request body into memory, then watches the connection for a disconnect.

    With *on_body_end* (an upload), nothing is read ahead: the app's ``receive`` calls are
    passed the body as it arrives, counted against *limit*, and *on_body_end* runs with
    its last piece (it may raise :class:`UploadRefused`, which reaches the app); the
    watcher starts then."""

    def __init__(
        self,
        receive: Receive,
        token: CancellationToken,
        limit: int,
        *,
        on_body_end: Callable[[], None] | None = None,
    ) -> None:
        self._receive = receive
        self._token = token
        self._limit = limit
        self._body_messages: list[Message] = []
        self._on_body_end = on_body_end
        #: An upload's: the body is streamed to the app, not read ahead.
        self.upload = on_body_end is not None
        self._streaming = self.upload
        self._size = 0
        self.body = b""
        self._disconnected = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected_at: float | None = None

    async def read_body(self) -> bool:
        """Buffer the whole body; False if the client left while sending it."""
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._mark_disconnected()
                return False
            self._count(message)
            self._body_messages.append(message)
            if not message.get("more_body", False):
                self.body = b"".join(m.get("body", b"") for m in self._body_messages)
                return True

    def _count(self, message: Message) -> None:
        self._size += len(message.get("body", b""))
        if self._size > self._limit:
            raise _BodyTooLarge

    def start_watching(self) -> None:
        if self._watcher is None:
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
        """The ``receive`` the app sees: the body (buffered, or streamed for an upload),
        then the disconnect."""
        if self._body_messages:
            return self._body_messages.pop(0)
        if self._streaming:
            return await self._stream()
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def _stream(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._streaming = False
            self._mark_disconnected()
            return message
        try:
            self._count(message)
        except _BodyTooLarge:
            raise UploadRefused(_too_large(self._limit, upload=True), 413) from None
        if not message.get("more_body", False):
            self._streaming = False
            assert self._on_body_end is not None
            self._on_body_end()
            self.start_watching()
        return message


def _too_large(limit: int, *, upload: bool) -> str:
    if upload:
        return f"upload exceeds the limit of {limit} bytes (the server's HEED_MAX_UPLOAD_BYTES)"
    return f"request body exceeds the limit of {limit} bytes (the server's HEED_MAX_BODY_BYTES)"


AUDITED_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods of the requests the audit hook is told of (bank routes only)."""

AuditHook = Callable[[RequestContext, str, str, str, str, int, float], None]
"""``(context, bank_id, action, method, route template, status, seconds)``: an admitted
request with one of :data:`AUDITED_METHODS` to a route with a ``bank_id`` was answered."""


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
        spool: SpoolBudget | None = None,
        audit: AuditHook | None = None,
    ) -> None:
        self.app = app
        #: Told of every admitted mutating request to a bank once it is answered.
        self.audit = audit
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
        self.spool = spool

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
        declared = self._declared_length(scope)
        if declared > limit:
            await _send_json(send, 413, _detail(self._too_large_message(upload)), [])
            return

        token = CancellationToken()
        ctx = RequestContext(tenant=identity.tenant, principal=identity.principal, token=token)
        scope.setdefault("state", {})["request_context"] = ctx
        if upload and self.spool is not None:
            await self._upload(scope, receive, send, status_holder, identity, gate, ctx, declared)
            return
        owner = _ReceiveOwner(receive, token, limit)
        try:
            await self._read_and_run(scope, send, status_holder, identity, gate, owner, ctx)
        except _BodyTooLarge:
            await _send_json(send, 413, _detail(self._too_large_message(upload)), [])

    async def _upload(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status_holder: dict[str, Any],
        identity: Identity,
        gate: Admission | None,
        ctx: RequestContext,
        declared: int,
    ) -> None:
        """Run an upload: its bytes claimed first, the app run before its body is read,
        its admission place taken when the body has arrived (see the module docstring)."""
        assert self.spool is not None
        try:
            claim = self.spool.claim(identity.tenant, declared or None)
        except UploadRefused as refused:
            await _send_json(send, refused.status_code, _detail(refused.message), _headers(refused))
            return
        try:
            if await self._revoked(identity, ctx, send):
                return
            ticket: list[Ticket] = []

            def arrived() -> None:
                if gate is None:
                    return
                entered = gate.enter(identity.tenant)
                if isinstance(entered, str):
                    self.metrics.record_overload("in_flight")
                    raise UploadRefused(entered, 503, 1)
                ticket.append(entered)

            scope["state"][STATE_KEY] = claim
            owner = _ReceiveOwner(receive, ctx.token, self.max_upload_bytes, on_body_end=arrived)
            if gate is not None:
                send = _leaving_on_start(send, gate, lambda: ticket[0] if ticket else None)
            try:
                await self._run_app(scope, send, status_holder, owner, ctx)
            finally:
                if ticket and gate is not None:
                    gate.leave(ticket[0])
        finally:
            _close(claim)

    async def _revoked(self, identity: Identity, ctx: RequestContext, send: Send) -> bool:
        """Whether the request's UI session was ended (answered 401 then)."""
        if identity.session_id is None or self.revocations is None:
            return False
        with use_context(ctx):
            revoked = await self.revocations.is_revoked(identity.session_id)
        if revoked:
            message = "the UI session has ended (logged out); log in again"
            await _send_json(send, 401, _detail(message), [])
        return revoked

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
        if await self._revoked(identity, ctx, send):
            return
        ticket = gate.enter(identity.tenant) if gate is not None else None
        if isinstance(ticket, str):
            self.metrics.record_overload("in_flight")
            await _send_json(send, 503, _detail(ticket), [(b"retry-after", b"1")])
            return
        if ticket is not None and gate is not None:
            entered = ticket
            send = _leaving_on_start(send, gate, lambda: entered)
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

        if not owner.upload:
            owner.start_watching()  # an upload's watcher starts once its body has arrived
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
        return _too_large(self.max_upload_bytes if upload else self.max_body_bytes, upload=upload)

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
        if self.audit is not None and method in AUDITED_METHODS and route is not None:
            ctx = scope.get("state", {}).get("request_context")
            bank_id = scope.get("path_params", {}).get("bank_id")
            if isinstance(ctx, RequestContext) and isinstance(bank_id, str):
                self.audit(
                    ctx,
                    bank_id,
                    getattr(route, "name", "") or template,
                    method,
                    template,
                    status,
                    seconds,
                )
