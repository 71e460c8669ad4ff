"""Section ``webhooks`` (since version 2): the bank's webhooks, secrets included, with its
settings (at most :data:`MAX_WEBHOOKS`).

The rules a webhook meets are the webhook service's (:class:`heed.webhooks.service.Webhooks`):
an import checks each as ``POST .../webhooks`` would (before anything is written, in
:meth:`heed.transfer.service.BankTransfers.submit_import`, and again here) and stages it
under a new id as the new bank's; a failed import discards them with the staging bank.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from heed.memory.models import InvalidInput
from heed.transfer.records import Id, Record, epoch, epoch_iso, fields_of, validate
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section
from heed.webhooks.models import HttpConfig, Webhook

__all__ = ["MAX_WEBHOOKS", "SECTION", "WebhookRecord"]

#: Most webhooks an archive carries.
MAX_WEBHOOKS: Final = 100


class HttpConfigRecord(Record):
    method: Literal["POST"]
    timeout_seconds: Annotated[int, Field(ge=1, le=60)]
    headers: dict[str, str]
    params: dict[str, str]


class WebhookRecord(Record):
    """A webhook of the bank, its secret included: the rules a webhook's fields meet
    (target allow-list, events, secret) are the webhook service's, applied again where the
    archive is imported."""

    id: Id
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    secret: Annotated[str, Field(min_length=1, max_length=512)]
    event_types: Annotated[list[Annotated[str, Field(max_length=100)]], Field(max_length=32)]
    enabled: bool
    http_config: HttpConfigRecord
    created_at: str
    updated_at: str


def encode(webhook: Webhook) -> dict[str, Any]:
    return fields_of(
        webhook,
        WebhookRecord,
        http_config=fields_of(webhook.http_config, HttpConfigRecord),
        created_at=epoch_iso(webhook.created_at),
        updated_at=epoch_iso(webhook.updated_at),
    )


def decode(value: dict[str, Any], dim: int, where: str) -> Webhook:
    """A carried webhook: no tenant or bank yet (the import stages it as the new bank's)."""
    record = validate(WebhookRecord, value, where)
    return Webhook(
        **record.model_dump(exclude={"http_config", "created_at", "updated_at"}),
        tenant="",
        bank_ref="",
        bank_id="",
        http_config=HttpConfig(**record.http_config.model_dump()),
        created_at=epoch(record.created_at, "created_at", where),
        updated_at=epoch(record.updated_at, "updated_at", where),
    )


def read(ctx: ExportContext) -> Iterator[list[Webhook]]:
    if ctx.stores.webhooks is not None:
        yield ctx.stores.webhooks.bank_webhooks(ctx.bank)


def write(ctx: ImportContext) -> dict[str, int]:
    """Stage the archive's webhooks as the target bank's (under the staging bank's ref,
    which the bank keeps when published)."""
    webhooks: list[Webhook] = list(ctx.reader.rows("webhooks"))
    if not webhooks:
        return {}
    service = ctx.stores.webhooks
    if service is None:
        raise InvalidInput("this server cannot import webhooks")
    service.check_carried(webhooks)
    return {"webhooks": service.stage_carried(webhooks, ctx.target)}


def check(checker: Checker) -> None:
    checker.unique("webhooks", MAX_WEBHOOKS, "webhooks; an archive carries at most")


SECTION = Section("webhooks", 2, "config", encode, decode, read, write, check)
