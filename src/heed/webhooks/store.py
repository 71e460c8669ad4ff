"""What webhooks need of storage (:class:`WebhookStore`), implemented for SQLite and
PostgreSQL by :class:`heed.storage.webhook_store.SqlWebhookStore`.

Every method is a short blocking call. :meth:`WebhookStore.enqueue` and
:meth:`WebhookStore.subscribers` join the caller's transaction when called inside one (the
run store's, when a run ends): that is how a delivery is written with its event.
"""

from __future__ import annotations

from typing import Any, Protocol

from heed.webhooks.models import Delivery, Webhook

__all__ = ["WebhookStore"]


class WebhookStore(Protocol):
    def migrate(self) -> None:
        """Bring the schema to this heed's version."""

    def create(self, webhook: Webhook) -> None:
        """Store a new webhook."""

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
        see :mod:`heed.memory.transfer`) and their deliveries; how many webhooks."""

    def subscribers(self, tenant: str, bank_ref: str) -> list[Webhook]:
        """The bank's enabled webhooks (joins the caller's transaction)."""

    def enqueue(self, deliveries: list[Delivery]) -> None:
        """Add deliveries (joins the caller's transaction); one per webhook and event id."""

    def due(self, now: float, limit: int) -> list[Delivery]:
        """Pending deliveries whose time has come and whose lease (if any) has expired,
        oldest first."""

    def claim(self, delivery_id: str, owner: str, now: float, lease_until: float) -> bool:
        """Take the delivery for *owner* until *lease_until*, if it is still pending and
        unleased (or its lease expired) at *now*: a guarded update, so of several workers
        racing, one wins."""

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
