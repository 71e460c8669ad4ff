"""A webhook, its HTTP delivery config, an event (stored once) and one delivery of it (a
row of the outbox and its log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["DELIVERED", "FAILED", "PENDING", "Delivery", "Event", "HttpConfig", "Webhook"]

#: A delivery's status: waiting for its first or next try.
PENDING: Final = "pending"
#: Answered 2xx.
DELIVERED: Final = "delivered"
#: Out of tries, or its target was refused: never tried again.
FAILED: Final = "failed"


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """How a webhook's deliveries are sent: always ``POST``; a timeout; extra headers and
    query parameters."""

    method: str = "POST"
    timeout_seconds: int = 30
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Webhook:
    """A bank's subscription: where to send which events, signed with *secret*."""

    id: str
    tenant: str
    bank_ref: str
    bank_id: str
    url: str
    secret: str
    event_types: list[str]
    enabled: bool
    http_config: HttpConfig
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class Event:
    """The end of a bank's run as its subscribers are told it: one row per run and event
    type (``id``: ``<run id>:<event type>``), whatever the number of webhooks. *body* is
    the exact JSON every delivery of it sends and signs (small: ids, status and counts;
    see :func:`heed.webhooks.events.event_body`).

    ``fanned_out``: whether its deliveries (one per subscribed webhook) were written."""

    id: str
    tenant: str
    bank_ref: str
    event_type: str
    body: str
    created_at: float
    fanned_out: bool = False


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event for one webhook: its status and tries; the body is the event's
    (:class:`Event`, by ``event_id``).

    ``seq`` orders a webhook's deliveries (its log is cut to the newest ones by it).
    ``lease_owner`` / ``lease_until``: the worker that claimed it, until when; nobody else
    sends it meanwhile."""

    id: str
    tenant: str
    bank_ref: str
    webhook_id: str
    event_id: str
    event_type: str
    url: str
    status: str
    attempts: int
    next_attempt_at: float
    created_at: float
    updated_at: float
    seq: int = 0
    lease_owner: str | None = None
    lease_until: float | None = None
    last_error: str | None = None
    last_response_status: int | None = None
    last_response_body: str | None = None
    last_attempt_at: float | None = None
