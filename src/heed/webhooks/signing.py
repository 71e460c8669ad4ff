"""The signature of a delivery: HMAC-SHA256 over the exact body bytes, keyed by the
webhook's secret, sent as ``X-Heed-Signature: sha256=<hex>``.

A receiver computes the same HMAC over the raw body it read (before parsing it) and compares
in constant time (:func:`verify` is that check). The body carries the event's id and time
(``id``, ``created_at``): a receiver that wants replay protection keeps the ids it has seen
(``X-Heed-Delivery`` names the delivery, the same on every retry of it).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "sign",
    "verify",
]

SIGNATURE_HEADER: Final = "X-Heed-Signature"
EVENT_HEADER: Final = "X-Heed-Event"
DELIVERY_HEADER: Final = "X-Heed-Delivery"
_PREFIX: Final = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The header value for *body* under *secret*: ``sha256=<hex digest>``."""
    return _PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Whether *header* is the signature of *body* under *secret* (constant-time)."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)
