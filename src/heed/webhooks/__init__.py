"""Webhooks: a bank's subscribers told, signed and with retries, when its runs end.

- :mod:`~heed.webhooks.events`: the event names and the one map from run kinds to them;
  the (small) body of an event.
- :mod:`~heed.webhooks.models`: a webhook, its HTTP config, an event, a delivery.
- :mod:`~heed.webhooks.store`: the store protocol (implemented in
  :mod:`heed.storage.webhook_store`).
- :mod:`~heed.webhooks.targets`: the SSRF allow-list a target URL and every address it
  resolves to must pass.
- :mod:`~heed.webhooks.signing`: the HMAC-SHA256 signature and its header.
- :mod:`~heed.webhooks.service`: webhooks' rules (create, update, list, delete, the
  delivery log, the cap per bank) and the outbox: a run's events, written in the
  transaction that ends it.
- :mod:`~heed.webhooks.worker`: the background worker that fans events out to deliveries,
  prunes the log, and sends due deliveries under a lease in the database, each try within
  one deadline, tenants and webhooks each held to a share of the senders, with exponential
  backoff.
"""

from heed.webhooks.events import EVENT_TYPES, KIND_EVENTS, RUN_COMPLETED
from heed.webhooks.models import Delivery, Event, HttpConfig, Webhook
from heed.webhooks.service import Webhooks
from heed.webhooks.signing import SIGNATURE_HEADER, sign, verify
from heed.webhooks.worker import DeliveryWorker

__all__ = [
    "EVENT_TYPES",
    "KIND_EVENTS",
    "RUN_COMPLETED",
    "SIGNATURE_HEADER",
    "Delivery",
    "DeliveryWorker",
    "Event",
    "HttpConfig",
    "Webhook",
    "Webhooks",
    "sign",
    "verify",
]
