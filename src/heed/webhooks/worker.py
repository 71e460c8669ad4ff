"""The delivery worker: sends the outbox's due deliveries, once each across instances.

One worker per process (started and closed by the composition root). Each pass it reads
up to :data:`BATCH` due deliveries (pending, their time come, no live lease) and **claims**
each with a guarded update that sets a lease (``lease_owner`` = this process, ``lease_until``
= now + ``HEED_WEBHOOK_LEASE_SECONDS``): of several instances racing for one delivery, one
update matches and the others match nothing, so no two instances send it at once. The
claimed deliveries are sent concurrently; each try is then recorded by an update guarded by
the same lease, which also releases it:

- **2xx**: ``delivered``;
- anything else (another status, a timeout, a connection error, a redirect to a refused
  address): ``attempts`` + 1 and, while tries are left (``HEED_WEBHOOK_MAX_ATTEMPTS``),
  ``pending`` again at now + ``HEED_WEBHOOK_BACKOFF_SECONDS`` x 2^(attempts - 1) (at most an
  hour); the last try makes it ``failed``. A target the allow-list refuses, or a webhook
  deleted or disabled meanwhile, fails it at once.

Each try is a ``POST`` of the body stored with the delivery, with ``Content-Type:
application/json``, ``X-Heed-Event``, ``X-Heed-Delivery`` and ``X-Heed-Signature``
(:mod:`heed.webhooks.signing`) and the webhook's own headers and query parameters, within
its timeout. Redirects are followed by hand, up to :data:`MAX_REDIRECTS`, each hop's target
checked against the allow-list first. The answer's first :data:`KEEP_BODY_CHARS` characters
go into the log.

Delivery is at least once: a process that dies after a receiver answered and before the try
was recorded leaves the delivery to be sent again when its lease expires. Receivers
deduplicate on ``X-Heed-Delivery`` (or the body's ``id``, the event's).

Stopping (:meth:`DeliveryWorker.aclose`) cancels the loop and every send in flight, gives
their leases back (so another instance may send them at once) and returns only once all of
it has finished (:func:`heed.runtime.settle`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urljoin

import httpx

from heed.runs.io import BlockingIO
from heed.runtime import reraise_cancellation, settle
from heed.webhooks.models import DELIVERED, FAILED, PENDING, Delivery, Webhook
from heed.webhooks.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, sign
from heed.webhooks.store import WebhookStore
from heed.webhooks.targets import TargetRefused, check_target

__all__ = ["BATCH", "KEEP_BODY_CHARS", "MAX_REDIRECTS", "DeliveryWorker", "backoff"]

log = logging.getLogger("heed.webhooks")

BATCH: Final = 16
MAX_REDIRECTS: Final = 3
KEEP_BODY_CHARS: Final = 1024
MAX_BACKOFF_SECONDS: Final = 3600.0


def backoff(base: float, attempts: int) -> float:
    """The delay before the try after *attempts* failed ones: base x 2^(attempts - 1), at
    most an hour."""
    return float(min(base * 2 ** max(0, attempts - 1), MAX_BACKOFF_SECONDS))


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


class DeliveryWorker:
    """Sends due deliveries (see the module docstring)."""

    def __init__(
        self,
        store: WebhookStore,
        owner: str,
        *,
        allow_private: bool,
        max_attempts: int,
        backoff_seconds: float,
        poll_seconds: float,
        lease_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.owner = owner
        self.allow_private = allow_private
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.poll_seconds = poll_seconds
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.io = BlockingIO(2, name="heed-webhooks")
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        """Start the loop (once)."""
        if self._task is None:
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
            self._task = asyncio.create_task(self._loop(), name="heed-webhook-worker")

    async def aclose(self) -> None:
        """Stop the loop and every send in flight; return once they finished."""
        if self._task is not None:
            await settle(self._task)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self.io.close()

    async def _loop(self) -> None:
        while True:
            try:
                done = await self.pass_once()
            except Exception as exc:
                reraise_cancellation(exc)
                log.exception("webhook delivery pass failed")
                done = 0
            if done < BATCH:
                await asyncio.sleep(self.poll_seconds)

    async def pass_once(self) -> int:
        """Claim and send what is due; how many deliveries were claimed."""
        now = self.clock()
        due = await self.io.call(self.store.due, now, BATCH)
        claimed: list[Delivery] = []
        for delivery in due:
            lease_until = now + self.lease_seconds
            if await self.io.call(self.store.claim, delivery.id, self.owner, now, lease_until):
                claimed.append(delivery)
        if claimed:
            sends = [asyncio.ensure_future(self._deliver(d)) for d in claimed]
            try:
                await asyncio.gather(*sends)
            finally:
                for send in sends:
                    await settle(send)
        return len(claimed)

    async def _deliver(self, delivery: Delivery) -> None:
        try:
            fields = await self._try(delivery)
        except asyncio.CancelledError:
            await self.io.call(self.store.release, delivery.id, self.owner)
            raise
        if not await self.io.call(self.store.finish, delivery.id, self.owner, fields):
            log.warning(
                "webhook delivery %s: the lease was lost before the try was recorded", delivery.id
            )
        elif fields["status"] == DELIVERED:
            self.sent += 1

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
            status, body = await self._send(webhook, delivery)
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
            last_response_body=body,
        )
        return fields

    async def _send(self, webhook: Webhook, delivery: Delivery) -> tuple[int, str]:
        """POST the delivery (following redirects by hand); ``(status, body)`` of a 2xx,
        else :class:`_Failed`."""
        assert self._client is not None, "the worker is not started"
        content = delivery.body.encode()
        headers = {
            **webhook.http_config.headers,
            "Content-Type": "application/json",
            "User-Agent": "heed-webhooks",
            EVENT_HEADER: delivery.event_type,
            DELIVERY_HEADER: delivery.id,
            SIGNATURE_HEADER: sign(webhook.secret, content),
        }
        url = webhook.url
        params: dict[str, str] | None = webhook.http_config.params or None
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                await self.io.call(check_target, url, self.allow_private)
            except TargetRefused as exc:
                raise _Failed(str(exc), final=True) from None
            try:
                async with self._client.stream(
                    "POST",
                    url,
                    content=content,
                    headers=headers,
                    params=params,
                    timeout=float(webhook.http_config.timeout_seconds),
                ) as response:
                    body = await _head_of(response)
            except httpx.HTTPError as exc:
                raise _Failed(
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                ) from None
            if response.is_redirect and "location" in response.headers:
                url = urljoin(str(response.url), response.headers["location"])
                params = None  # the Location is the whole next URL
                continue
            if 200 <= response.status_code < 300:
                return response.status_code, body
            raise _Failed(f"HTTP {response.status_code}", status=response.status_code, body=body)
        raise _Failed(f"more than {MAX_REDIRECTS} redirects")


async def _head_of(response: httpx.Response) -> str:
    """The first :data:`KEEP_BODY_CHARS` characters of *response*'s body (the rest unread)."""
    kept = bytearray()
    async for chunk in response.aiter_bytes():
        kept.extend(chunk)
        if len(kept) >= KEEP_BODY_CHARS * 4:
            break
    return kept.decode("utf-8", "replace")[:KEEP_BODY_CHARS]
