"""Webhooks' wire format: Hindsight's ``CreateWebhookRequest``, ``UpdateWebhookRequest``,
``WebhookResponse``, ``WebhookListResponse``, ``WebhookDeliveryResponse`` and
``WebhookDeliveryListResponse`` (``/v1/default/banks/{bank_id}/webhooks``).

Request models keep unknown fields so the route can refuse them by name (400), rather than
ignore them. Times are ISO 8601 strings.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from heed.api.input_rules import JSON_INTEGER, MAX_LIST_ITEMS, RequestBody
from heed.memory.models import InvalidInput
from heed.webhooks.models import Delivery, HttpConfig, Webhook
from heed.webhooks.service import WebhookChanges
from heed.webhooks.targets import MAX_URL_CHARS

__all__ = [
    "CreateWebhookRequest",
    "UpdateWebhookRequest",
    "WebhookDeliveryListResponse",
    "WebhookDeliveryResponse",
    "WebhookHttpConfig",
    "WebhookListResponse",
    "WebhookResponse",
    "changes_of",
    "delivery_out",
    "refuse_unknown",
    "webhook_out",
]

_ShortText = Annotated[str, Field(max_length=4096)]
_Names = Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=MAX_LIST_ITEMS)]
_Pairs = Annotated[
    dict[Annotated[str, Field(max_length=128)], _ShortText], Field(max_length=MAX_LIST_ITEMS)
]


#: Unknown fields are allowed in, to be refused by name (a 400, not a 422); the schema
#: still bounds how many a client may send.
_REFUSED_EXTRAS: Final[dict[str, Any]] = {"maxProperties": 32}


class WebhookHttpConfig(RequestBody):
    """How deliveries are sent: ``POST`` only; 1-60 s; extra headers and query parameters."""

    model_config = ConfigDict(strict=True, extra="allow", json_schema_extra=_REFUSED_EXTRAS)

    method: Annotated[str, Field(max_length=16)] = "POST"
    timeout_seconds: Annotated[int, Field(ge=-(2**31), le=2**31), JSON_INTEGER] = 30
    headers: _Pairs | None = None
    params: _Pairs | None = None

    def to_config(self) -> HttpConfig:
        refuse_unknown(self, "http_config")
        return HttpConfig(
            method=self.method,
            timeout_seconds=self.timeout_seconds,
            headers=dict(self.headers or {}),
            params=dict(self.params or {}),
        )


class CreateWebhookRequest(RequestBody):
    model_config = ConfigDict(strict=True, extra="allow", json_schema_extra=_REFUSED_EXTRAS)

    url: Annotated[str, Field(max_length=MAX_URL_CHARS)]
    secret: Annotated[str, Field(max_length=512)] | None = None
    event_types: _Names | None = None
    enabled: bool = True
    http_config: WebhookHttpConfig | None = None


class UpdateWebhookRequest(RequestBody):
    """Only the fields given change."""

    model_config = ConfigDict(strict=True, extra="allow", json_schema_extra=_REFUSED_EXTRAS)

    url: Annotated[str, Field(max_length=MAX_URL_CHARS)] | None = None
    secret: Annotated[str, Field(max_length=512)] | None = None
    event_types: _Names | None = None
    enabled: bool | None = None
    http_config: WebhookHttpConfig | None = None


def changes_of(body: UpdateWebhookRequest) -> WebhookChanges:
    """The changes an update names (a field sent as null changes nothing)."""
    given = body.model_fields_set
    changes = WebhookChanges()
    if "url" in given:
        changes.url = body.url
    if "secret" in given:
        changes.secret = body.secret
    if "event_types" in given:
        changes.event_types = body.event_types
    if "enabled" in given:
        changes.enabled = body.enabled
    if "http_config" in given and body.http_config is not None:
        changes.http_config = body.http_config.to_config()
    return changes


def refuse_unknown(body: BaseModel, where: str | None = None) -> None:
    """A 400 naming the first field *body* has that heed does not implement."""
    extra = body.model_extra or {}
    if extra:
        name = next(iter(extra))
        path = f"{where}.{name}" if where else name
        raise InvalidInput(f"{path} is not supported by heed")


class WebhookHttpConfigOut(BaseModel):
    method: str
    timeout_seconds: int
    headers: dict[str, str]
    params: dict[str, str]


class WebhookResponse(BaseModel):
    """A webhook; ``secret`` only in the answer that created it (or changed it)."""

    id: str
    bank_id: str | None
    url: str
    secret: str | None = None
    event_types: list[str]
    enabled: bool
    http_config: WebhookHttpConfigOut | None = None
    created_at: str | None = None
    updated_at: str | None = None


class WebhookListResponse(BaseModel):
    items: list[WebhookResponse]
    total: int
    limit: int
    offset: int


class WebhookDeliveryResponse(BaseModel):
    id: str
    event_id: str | None = None
    webhook_id: str | None
    url: str
    event_type: str
    status: str = Field(description="pending, delivered or failed")
    attempts: int
    next_retry_at: str | None = None
    last_error: str | None = None
    last_response_status: int | None = None
    last_response_body: str | None = None
    last_attempt_at: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


class WebhookDeliveryListResponse(BaseModel):
    items: list[WebhookDeliveryResponse]
    next_cursor: str | None = None


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


def webhook_out(webhook: Webhook, *, with_secret: bool = False) -> WebhookResponse:
    """A webhook as the client reads it: its fields by name (``secret`` only *with_secret*),
    its times as ISO text."""
    return WebhookResponse.model_validate(
        {
            **asdict(webhook),
            "secret": webhook.secret if with_secret else None,
            "created_at": _iso(webhook.created_at),
            "updated_at": _iso(webhook.updated_at),
        }
    )


def delivery_out(delivery: Delivery) -> WebhookDeliveryResponse:
    """A delivery as the client reads it: its fields by name, its times as ISO text (the
    next try's only while it is pending)."""
    pending = delivery.status == "pending"
    return WebhookDeliveryResponse.model_validate(
        {
            **asdict(delivery),
            "next_retry_at": _iso(delivery.next_attempt_at) if pending else None,
            "last_attempt_at": _iso(delivery.last_attempt_at),
            "created_at": _iso(delivery.created_at),
            "updated_at": _iso(delivery.updated_at),
        }
    )
