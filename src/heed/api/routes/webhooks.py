"""Webhooks (``/v1/default/banks/{bank_id}/webhooks``): HTTP only.

Register, list, update and delete a bank's webhooks, and read one's delivery log; every
rule (the allow-list, the events, the secret, the HTTP config) is
:class:`heed.webhooks.Webhooks`'. Fields heed does not implement are refused by name.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from heed.api.deps import MemoryDep, WebhooksDep
from heed.api.input_rules import IdPath, QueryId
from heed.api.paging import PageQuery, page_query
from heed.api.routing import HeedRoute
from heed.api.wire import webhooks as wire
from heed.api.wire.memory import DeleteResponse, deleted

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/webhooks", tags=["webhooks"], route_class=HeedRoute
)
WebhooksPage = Annotated[PageQuery, Depends(page_query(least=0))]
"""``limit`` 0 to 1000 (default 100) and ``offset``."""


@router.post("", status_code=201)
async def create_webhook(
    bank_id: IdPath, body: wire.CreateWebhookRequest, engine: MemoryDep, webhooks: WebhooksDep
) -> wire.WebhookResponse:
    """Register a webhook; the answer carries its secret (generated when not given), the
    only time it is shown."""
    wire.refuse_unknown(body)
    config = body.http_config.to_config() if body.http_config is not None else None
    bank = await engine.get_bank(bank_id)
    webhook = await webhooks.create(
        bank,
        body.url,
        secret=body.secret,
        event_types=body.event_types,
        enabled=body.enabled,
        http_config=config,
    )
    return wire.webhook_out(webhook, with_secret=True)


@router.get("")
async def list_webhooks(
    bank_id: IdPath,
    engine: MemoryDep,
    webhooks: WebhooksDep,
    page: WebhooksPage,
) -> wire.WebhookListResponse:
    """The bank's webhooks, oldest first (secrets not shown)."""
    bank = await engine.get_bank(bank_id)
    found, total = await webhooks.list_bank(bank, page.limit, page.offset)
    return page.answer(wire.WebhookListResponse, [wire.webhook_out(w) for w in found], total)


@router.patch("/{webhook_id}")
async def update_webhook(
    bank_id: IdPath,
    webhook_id: IdPath,
    body: wire.UpdateWebhookRequest,
    engine: MemoryDep,
    webhooks: WebhooksDep,
) -> wire.WebhookResponse:
    """Change the fields given; a new secret is shown in this answer."""
    wire.refuse_unknown(body)
    changes = wire.changes_of(body)
    bank = await engine.get_bank(bank_id)
    webhook = await webhooks.update(bank, webhook_id, changes)
    return wire.webhook_out(webhook, with_secret=body.secret is not None)


@router.delete("/{webhook_id}")
async def delete_webhook(
    bank_id: IdPath, webhook_id: IdPath, engine: MemoryDep, webhooks: WebhooksDep
) -> DeleteResponse:
    """Delete the webhook and its delivery log."""
    bank = await engine.get_bank(bank_id)
    await webhooks.delete(bank, webhook_id)
    return deleted(f"webhook {webhook_id!r} deleted", 1)


@router.get("/{webhook_id}/deliveries")
async def list_webhook_deliveries(
    bank_id: IdPath,
    webhook_id: IdPath,
    engine: MemoryDep,
    webhooks: WebhooksDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: QueryId | None = None,
) -> wire.WebhookDeliveryListResponse:
    """The webhook's deliveries, newest first; ``next_cursor`` pages on."""
    bank = await engine.get_bank(bank_id)
    page, next_cursor = await webhooks.deliveries(bank, webhook_id, limit, cursor)
    return wire.WebhookDeliveryListResponse(
        items=[wire.delivery_out(d) for d in page], next_cursor=next_cursor
    )
