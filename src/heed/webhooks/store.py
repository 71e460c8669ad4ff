"""What webhooks need of storage (:class:`WebhookStore`), implemented for SQLite and
PostgreSQL by :class:`heed.storage.webhook_store.SqlWebhookStore`.

Every method is a short blocking call. :meth:`WebhookStore.add_events` and
:meth:`WebhookStore.subscribers` join the caller's transaction when called inside one (the
run store's, when a run ends): that is how an event is written with the run's end. Its
deliveries are written later, by :meth:`WebhookStore.fan_out`, in a transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from heed.webhooks.models import Delivery, Event, Webhook

__all__ = ["WebhookStore"]


class WebhookStore(Protocol):
    def migrate(self) -> None:
        """Bring the schema to this heed's version."""

    def create(self, webhook: Webhook, limit: int | None = None) -> bool:
        """Store a new webhook; ``False`` (nothing written) when its bank already has
        *limit* webhooks (counted and written under the bank's lock)."""

    def get(self, tenant: str, bank_ref: str, webhook_id: str) -> Webhook | None:
        """The bank's webhook, or ``None``."""

    def get_by_id(self, webhook_id: str) -> Webhook | None:
        """A webhook by id alone (the delivery worker's read)."""

    def list_bank(
        self, tenant: str, bank_ref: str, limit: int, offset: int
    ) -> tuple[list[Webhook], int]:
        """``(page, total)``: the bank's webhooks, oldest first."""

    def update(self, webhook: Webhook) -> bool:
        """Replace the webhook's fields; ``False`` when it is gone."""

    def delete(self, tenant: str, bank_ref: str, webhook_id: str) -> bool:
        """Delete the webhook and its deliveries; ``False`` when it was not there."""

    def delete_bank(self, tenant: str, bank_ref: str) -> int:
        """Delete every webhook of the bank and their deliveries; how many webhooks."""

    def delete_ref(self, bank_ref: str) -> int:
        """Delete every webhook whose bank is *bank_ref* (of any tenant: a staging bank's,
        see :mod:`heed.transfer.service`) and their deliveries; how many webhooks."""

    def subscribers(self, tenant: str, bank_ref: str) -> list[Webhook]:
        """The bank's enabled webhooks (joins the caller's transaction)."""

    def add_events(self, events: list[Event]) -> None:
        """Add events not yet fanned out (joins the caller's transaction); an event id
        already stored is left as it is."""

    def pending_events(self, per_tenant: int, limit: int) -> list[Event]:
        """Events not yet fanned out, oldest first per tenant, taking turns between tenants:
        at most *per_tenant* of each, *limit* in all."""

    def fan_out(self, event_id: str, now: float, keep: int) -> int:
        """Write the event's deliveries, one per enabled webhook of its bank subscribed to
        its type, and cut each such webhook's log to its newest *keep* deliveries (finished
        ones only), in one transaction; how many deliveries. An event already fanned out
        (by another instance) writes nothing; one nobody subscribes to is deleted."""

    def enqueue(self, deliveries: list[Delivery]) -> None:
        """Add deliveries (joins the caller's transaction); one per webhook and event id."""

    def event_body(self, event_id: str) -> str | None:
        """The body of an event, or ``None`` when it is gone."""

    def due(
        self,
        now: float,
        limit: int,
        skip_tenants: Sequence[str] = (),
        skip_webhooks: Sequence[str] = (),
    ) -> list[Delivery]:
        """Pending deliveries whose time has come and whose lease (if any) has expired,
        oldest first, leaving out those of *skip_tenants* and *skip_webhooks*."""

    def prune(self, before: float, batch: int) -> int:
        """Delete up to *batch* finished deliveries whose last try was before *before*, the
        events no delivery points to any more, and events fanned out before *before* that
        have none; how many deliveries."""

    def claim(self, delivery_id: str, owner: str, now: float, lease_until: float) -> bool:
        """Take the delivery for *owner* until *lease_until*, if it is still pending and
        unleased (or its lease expired) at *now*: a guarded update, so of several workers
        racing, one wins."""

    def claim_many(
        self, delivery_ids: Sequence[str], owner: str, now: float, lease_until: float
    ) -> set[str]:
        """:meth:`claim` for several deliveries in one transaction; the ids claimed (one
        another instance holds, or that is no longer due, is left out)."""

    def finish(self, delivery_id: str, owner: str, fields: dict[str, Any]) -> bool:
        """Record a try (the status, attempts, next time, last answer) and release the
        lease, if *owner* still holds it."""

    def release(self, delivery_id: str, owner: str) -> None:
        """Give the lease back without recording a try (the worker is stopping)."""

    def deliveries(
        self,
        tenant: str,
        bank_ref: str,
        webhook_id: str,
        limit: int,
        before: tuple[float, str] | None,
    ) -> list[Delivery]:
        """The webhook's deliveries, newest first, older than *before* (``created_at``,
        ``id``) when given."""

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        """One delivery by id."""
