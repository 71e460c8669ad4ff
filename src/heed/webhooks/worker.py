"""The delivery worker: fans events out to deliveries and sends them, once each across
instances, each try bounded in time and no tenant or webhook holding more than its share.

One worker per process (started and closed by the composition root). Each pass it:

1. **fans out** events the runs' ends stored (:meth:`WebhookStore.pending_events`, tenants
   taking turns): one transaction per event writes a delivery per subscribed webhook
   (:meth:`WebhookStore.fan_out`), outside the run's own transaction;
2. **prunes** the delivery log, every ``HEED_WEBHOOK_PRUNE_INTERVAL_SECONDS``: finished
   deliveries whose last try is older than ``HEED_WEBHOOK_LOG_RETENTION_SECONDS``, and the
   events no delivery points to (a webhook's log is also cut to its newest
   ``HEED_WEBHOOK_LOG_MAX_PER_WEBHOOK`` as deliveries are written);
3. **starts sends**: it reads due deliveries (pending, their time come, no live lease),
   leaving out those of tenants and webhooks that already hold their share of this
   process's senders, and **claims** those that fit with one guarded update that sets a
   lease (``lease_owner`` = this process, ``lease_until`` = now +
   ``HEED_WEBHOOK_LEASE_SECONDS``): of several instances racing for one delivery, one update
   matches it. Each claimed delivery
   is sent by a task of its own: at most ``HEED_WEBHOOK_CONCURRENCY`` at once, of which at
   most ``HEED_WEBHOOK_CONCURRENCY_PER_TENANT`` for one tenant and
   ``HEED_WEBHOOK_CONCURRENCY_PER_WEBHOOK`` for one webhook. A send that ends frees its
   place at once and wakes the loop, so a slow target delays only its own deliveries
   (and, past its webhook's share, its tenant's), never another tenant's.

Each try is recorded by an update guarded by the lease, which also releases it:

- **2xx**: ``delivered``;
- anything else (another status, no answer within the deadline, a connection error, a
  redirect to a refused address): ``attempts`` + 1 and, while tries are left
  (``HEED_WEBHOOK_MAX_ATTEMPTS``), ``pending`` again at now + ``HEED_WEBHOOK_BACKOFF_SECONDS``
  x 2^(attempts - 1) (at most an hour); the last try makes it ``failed``. A target the
  allow-list refuses, or a webhook deleted or disabled meanwhile, fails it at once.

**A try** has one deadline, the webhook's ``http_config.timeout_seconds``, for all of it:
resolving the host, connecting, sending, the answer's head and the excerpt of its body, and
every redirect hop. The host is resolved **once** per hop and every answer checked against
the allow-list (:func:`heed.webhooks.targets.resolve`); the connection goes to a checked
address (the URL's host replaced by it, the ``Host`` header and the TLS server name and
certificate check kept for the URL's host: httpx's ``sni_hostname`` extension), on a
transport of its own (no connection is shared between tries). No URL is logged (a query
parameter may carry a receiver's token). The answer's status decides; at most
``HEED_WEBHOOK_RESPONSE_EXCERPT_BYTES`` of its body are read (raw, ``Accept-Encoding:
identity``) and kept in the log; a body still arriving at the deadline is not waited for.
A resolver that hangs (a thread in ``getaddrinfo``) holds its sender's place until it
returns: the place is freed only when the work has stopped.

Each try is a ``POST`` of the event's body (:class:`~heed.webhooks.models.Event`, the same
bytes on every try), with ``Content-Type: application/json``, ``X-Heed-Event``,
``X-Heed-Delivery`` and ``X-Heed-Signature`` (:mod:`heed.webhooks.signing`) and the
webhook's own headers and query parameters. Redirects are followed by hand, up to
:data:`MAX_REDIRECTS`, each hop's target resolved and checked first.

Delivery is at least once: a process that dies after a receiver answered and before the try
was recorded leaves the delivery to be sent again when its lease expires. Receivers
deduplicate on ``X-Heed-Delivery`` (or the body's ``id``, the event's).

Stopping (:meth:`DeliveryWorker.aclose`) cancels the loop and every send in flight, gives
their leases back (so another instance may send them at once) and returns only once all of
it has finished (:func:`heed.runtime.settle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final

import httpx

from heed.runs.io import BlockingIO
from heed.runtime import reraise_cancellation, settle
from heed.webhooks.models import DELIVERED, FAILED, PENDING, Delivery, Webhook
from heed.webhooks.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, sign
from heed.webhooks.store import WebhookStore
from heed.webhooks.targets import TargetRefused, resolve

__all__ = [
    "FAN_OUT_BATCH",
    "MAX_REDIRECTS",
    "DeliveryWorker",
    "LogLimits",
    "SendLimits",
    "backoff",
]

log = logging.getLogger("heed.webhooks")

#: Events fanned out per pass (tenants taking turns), and at most per tenant.
FAN_OUT_BATCH: Final = 16
FAN_OUT_PER_TENANT: Final = 4
#: Finished deliveries deleted per prune statement (a short transaction), and statements
#: per pass.
PRUNE_BATCH: Final = 1000
PRUNE_BATCHES_PER_PASS: Final = 10
MAX_REDIRECTS: Final = 3
MAX_BACKOFF_SECONDS: Final = 3600.0


def backoff(base: float, attempts: int) -> float:
    """The delay before the try after *attempts* failed ones: base x 2^(attempts - 1), at
    most an hour."""
    return float(min(base * 2 ** max(0, attempts - 1), MAX_BACKOFF_SECONDS))


@dataclass(frozen=True, slots=True)
class SendLimits:
    """How many sends run at once (in all, per tenant, per webhook), and how much of an
    answer is kept."""

    concurrency: int = 64
    per_tenant: int = 8
    per_webhook: int = 4
    excerpt_bytes: int = 256


@dataclass(frozen=True, slots=True)
class LogLimits:
    """How long and how much of the delivery log is kept, and how often it is pruned."""

    retention_seconds: float = 7 * 86400.0
    max_per_webhook: int = 1000
    prune_interval: float = 60.0


class _Failed(Exception):
    """A try that failed; ``final`` when no other try may help."""

    def __init__(
        self,
        message: str,
        *,
        final: bool = False,
        status: int | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message)
        self.final = final
        self.status = status
        self.body = body


@dataclass(eq=False)
class DeliveryWorker:
    """Fans out events and sends their deliveries (see the module docstring)."""

    store: WebhookStore
    owner: str
    _: KW_ONLY
    allow_private: bool
    max_attempts: int
    backoff_seconds: float
    poll_seconds: float
    lease_seconds: float
    limits: SendLimits = field(default_factory=SendLimits)
    log_limits: LogLimits = field(default_factory=LogLimits)
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.io = BlockingIO(4, name="heed-webhooks")
        # One thread per sender: a resolution never waits behind another tenant's.
        self._resolver = BlockingIO(self.limits.concurrency, name="heed-webhooks-dns")
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._sends: dict[str, asyncio.Task[None]] = {}
        self._per_tenant: Counter[str] = Counter()
        self._per_webhook: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._pruned_at = 0.0
        self._ssl: ssl.SSLContext | None = None

    @property
    def in_flight(self) -> int:
        """Sends running now."""
        return len(self._sends)

    def start(self) -> None:
        """Start the loop (once)."""
        if self._task is None:
            self._ssl = httpx.create_ssl_context()  # loaded once, shared by every try
            self._task = asyncio.create_task(self._loop(), name="heed-webhook-worker")

    async def aclose(self) -> None:
        """Stop the loop and every send in flight; return once they finished (each send
        gives its lease back)."""
        if self._task is not None:
            await settle(self._task)
            self._task = None
        sends = list(self._sends.values())
        for send in sends:
            send.cancel()
        for send in sends:
            await settle(send)
        self.io.close()
        self._resolver.close()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            busy = False
            try:
                busy = await self.pass_once()
            except Exception as exc:
                reraise_cancellation(exc)
                log.exception("webhook delivery pass failed")
            if not busy:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_seconds):
                        await self._wake.wait()  # a send ended: its place is free

    async def pass_once(self) -> bool:
        """Fan out, prune when due, start what is due; whether more fan-out work waits."""
        fanned = await self._fan_out()
        await self._prune()
        await self._dispatch()
        return fanned >= FAN_OUT_BATCH

    # -- 1. fan-out --------------------------------------------------------------------

    async def _fan_out(self) -> int:
        events = await self.io.call(self.store.pending_events, FAN_OUT_PER_TENANT, FAN_OUT_BATCH)
        for event in events:
            await self.io.call(
                self.store.fan_out, event.id, self.clock(), self.log_limits.max_per_webhook
            )
        return len(events)

    # -- 2. the log --------------------------------------------------------------------

    async def _prune(self) -> None:
        now = self.clock()
        if now - self._pruned_at < self.log_limits.prune_interval:
            return
        self._pruned_at = now
        before = now - self.log_limits.retention_seconds
        for _ in range(PRUNE_BATCHES_PER_PASS):
            if await self.io.call(self.store.prune, before, PRUNE_BATCH) < PRUNE_BATCH:
                return
        self._pruned_at = 0.0  # more to prune: on with it next pass, sends in between

    # -- 3. sends ----------------------------------------------------------------------

    async def _dispatch(self) -> int:
        """Claim due deliveries and start their sends while places are free; how many."""
        limits = self.limits
        started = 0
        while len(self._sends) < limits.concurrency:
            full_tenants = sorted(t for t, n in self._per_tenant.items() if n >= limits.per_tenant)
            full_hooks = sorted(w for w, n in self._per_webhook.items() if n >= limits.per_webhook)
            now = self.clock()
            free = limits.concurrency - len(self._sends)
            due = await self.io.call(self.store.due, now, free, full_tenants, full_hooks)
            chosen = self._within_shares(due, free)
            claimed = await self.io.call(
                self.store.claim_many,
                [d.id for d in chosen],
                self.owner,
                now,
                now + self.lease_seconds,
            )
            for delivery in chosen:
                if delivery.id in claimed:
                    self._start(delivery)
                    started += 1
            if not claimed:
                break
        return started

    def _within_shares(self, due: list[Delivery], free: int) -> list[Delivery]:
        """The first of *due* that fit the free places and their tenant's and webhook's
        shares (counting those already sending)."""
        limits = self.limits
        tenants, hooks = Counter(self._per_tenant), Counter(self._per_webhook)
        chosen: list[Delivery] = []
        for delivery in due:
            if len(chosen) >= free:
                break
            if (
                tenants[delivery.tenant] >= limits.per_tenant
                or hooks[delivery.webhook_id] >= limits.per_webhook
                or delivery.id in self._sends
            ):
                continue
            tenants[delivery.tenant] += 1
            hooks[delivery.webhook_id] += 1
            chosen.append(delivery)
        return chosen

    def _start(self, delivery: Delivery) -> None:
        self._per_tenant[delivery.tenant] += 1
        self._per_webhook[delivery.webhook_id] += 1
        self._sends[delivery.id] = asyncio.create_task(
            self._deliver(delivery), name=f"heed-webhook-send-{delivery.id}"
        )

    async def _deliver(self, delivery: Delivery) -> None:
        """Try *delivery* once and record it; its place is freed when all of it ended."""
        try:
            try:
                fields = await self._try(delivery)
            except asyncio.CancelledError:
                await self.io.call(self.store.release, delivery.id, self.owner)
                raise
            if not await self.io.call(self.store.finish, delivery.id, self.owner, fields):
                log.warning(
                    "webhook delivery %s: the lease was lost before the try was recorded",
                    delivery.id,
                )
            elif fields["status"] == DELIVERED:
                self.sent += 1
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("webhook delivery %s: recording the try failed", delivery.id)
        finally:
            self._sends.pop(delivery.id, None)
            for counter, key in (
                (self._per_tenant, delivery.tenant),
                (self._per_webhook, delivery.webhook_id),
            ):
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]
            self._wake.set()

    async def _try(self, delivery: Delivery) -> dict[str, Any]:
        """Send once; the fields that record the try."""
        now = self.clock()
        attempts = delivery.attempts + 1
        fields: dict[str, Any] = {"attempts": attempts, "last_attempt_at": now, "updated_at": now}
        try:
            webhook = await self.io.call(self.store.get_by_id, delivery.webhook_id)
            if webhook is None or not webhook.enabled:
                why = "deleted" if webhook is None else "disabled"
                raise _Failed(f"the webhook was {why}", final=True)
            body = await self.io.call(self.store.event_body, delivery.event_id)
            if body is None:
                raise _Failed("the event is gone", final=True)
            status, excerpt = await self._send(webhook, delivery, body.encode())
        except _Failed as failure:
            fields["last_error"] = str(failure)
            fields["last_response_status"] = failure.status
            fields["last_response_body"] = failure.body
            if failure.final or attempts >= self.max_attempts:
                fields["status"] = FAILED
                fields["next_attempt_at"] = now
            else:
                fields["status"] = PENDING
                fields["next_attempt_at"] = now + backoff(self.backoff_seconds, attempts)
            return fields
        fields.update(
            status=DELIVERED,
            next_attempt_at=now,
            last_error=None,
            last_response_status=status,
            last_response_body=excerpt,
        )
        return fields

    async def _send(self, webhook: Webhook, delivery: Delivery, content: bytes) -> tuple[int, str]:
        """POST the delivery (following redirects by hand) within the webhook's timeout;
        ``(status, excerpt)`` of a 2xx, else :class:`_Failed`."""
        timeout = float(webhook.http_config.timeout_seconds)
        deadline = asyncio.get_running_loop().time() + timeout
        headers = {
            **webhook.http_config.headers,
            "Content-Type": "application/json",
            "User-Agent": "heed-webhooks",
            "Accept-Encoding": "identity",
            EVENT_HEADER: delivery.event_type,
            DELIVERY_HEADER: delivery.id,
            SIGNATURE_HEADER: sign(webhook.secret, content),
        }
        url = _url(webhook.url, webhook.http_config.params)
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                async with asyncio.timeout_at(deadline):
                    addresses = await self._resolver.call(resolve, str(url), self.allow_private)
            except TargetRefused as exc:
                raise _Failed(str(exc), final=True) from None
            except TimeoutError:
                raise _Failed(_late(timeout, "resolving the host")) from None
            status, location, excerpt = await self._post(
                url, addresses, headers, content, deadline, limit=timeout
            )
            if location is not None:
                url = _url(location, base=url)  # the Location is the whole next URL
                continue
            if 200 <= status < 300:
                return status, excerpt
            raise _Failed(f"HTTP {status}", status=status, body=excerpt)
        raise _Failed(f"more than {MAX_REDIRECTS} redirects")

    async def _post(
        self,
        url: httpx.URL,
        addresses: list[str],
        headers: dict[str, str],
        content: bytes,
        deadline: float,
        *,
        limit: float,
    ) -> tuple[int, str | None, str]:
        """POST to *url* at the first of *addresses* that accepts a connection, before
        *deadline* (*limit* seconds after the try began); ``(status, redirect location or
        None, excerpt)``."""
        host = url.raw_host.decode("ascii")
        pinned_headers = {**headers, "Host": url.netloc.decode("ascii")}
        extensions: dict[str, Any] = {}
        if url.scheme == "https" and not _is_ip(host):
            extensions["sni_hostname"] = host  # TLS: the name's server, its certificate
        failure: Exception | None = None
        for address in addresses:
            remaining = deadline - asyncio.get_running_loop().time()
            request = httpx.Request(
                "POST",
                url.copy_with(host=address),
                content=content,
                headers=pinned_headers,
                extensions={
                    **extensions,
                    "timeout": httpx.Timeout(max(remaining, 0.001)).as_dict(),
                },
            )
            # A transport of its own (no connection shared between tries or hosts), used
            # without a client: httpx's client logs every request's URL, query included.
            async with httpx.AsyncHTTPTransport(
                verify=self._ssl or True, limits=httpx.Limits(max_keepalive_connections=0)
            ) as transport:
                try:
                    async with asyncio.timeout_at(deadline):
                        response = await transport.handle_async_request(request)
                except (TimeoutError, httpx.TimeoutException):
                    raise _Failed(_late(limit, "waiting for the answer")) from None
                except httpx.ConnectError as exc:
                    failure = exc
                    continue  # the next address, if any
                except httpx.HTTPError as exc:
                    raise _Failed(_described(exc)) from None
                try:
                    excerpt = await self._excerpt(response, deadline)
                finally:
                    await response.aclose()
            if response.is_redirect and "location" in response.headers:
                return response.status_code, response.headers["location"], excerpt
            return response.status_code, None, excerpt
        assert failure is not None
        raise _Failed(_described(failure))

    async def _excerpt(self, response: httpx.Response, deadline: float) -> str:
        """The first :attr:`SendLimits.excerpt_bytes` of *response*'s body, as far as it
        arrived by *deadline* (the rest is never read)."""
        wanted = self.limits.excerpt_bytes
        kept = bytearray()
        if wanted > 0:
            with contextlib.suppress(TimeoutError, httpx.HTTPError):
                async with asyncio.timeout_at(deadline):
                    async for chunk in response.aiter_raw():
                        kept.extend(chunk)
                        if len(kept) >= wanted:
                            break
        return bytes(kept[:wanted]).decode("utf-8", "replace")


def _url(
    text: str, params: dict[str, str] | None = None, *, base: httpx.URL | None = None
) -> httpx.URL:
    """*text* as httpx reads it (joined to *base* when given, *params* merged), or a
    final :class:`_Failed` naming why not."""
    try:
        url = base.join(text) if base is not None else httpx.URL(text)
        return url.copy_merge_params(params) if params else url
    except (httpx.InvalidURL, ValueError) as exc:
        raise _Failed(
            f"webhook url {text[:200]!r} is not a valid URL ({exc})", final=True
        ) from None


def _late(timeout: float, doing: str) -> str:
    return f"no answer within {timeout:g} s (http_config.timeout_seconds): timed out {doing}"


def _described(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
