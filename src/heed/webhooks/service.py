"""Webhooks' rules: a bank's subscriptions, their delivery log, and the outbox.

**Subscriptions.** A webhook belongs to one bank (and its tenant): a target URL that passes
the allow-list (:mod:`heed.webhooks.targets`), the events it wants (:data:`EVENT_TYPES`;
all of them when not given; an unknown one, or one heed does not send, is refused by name),
a secret (generated when not given, shown once: in the answer that created it), an
``enabled`` flag and an HTTP config (``POST`` only; a timeout of 1 to 60 s, the whole of a
try; up to 20 extra headers, none of heed's own or the transport's; up to 20 query
parameters). A bank has at most ``HEED_WEBHOOK_MAX_PER_BANK`` webhooks (100, what an archive
carries): one more is a 409 naming the limit and the setting. Deleting the bank deletes
its webhooks, their events and deliveries.

**The outbox.** :meth:`Webhooks.on_terminal` is a terminal hook of the run manager
(``RunManager.terminal_hooks``): it runs inside the transaction that makes a run terminal
(:func:`heed.runs.ending.end_run`), on the same database connection, so the run's events
(:func:`heed.webhooks.events.events_of`) are committed with the terminal row and its
journal event, or not at all. It writes one small row per event (its body, stored once:
:func:`heed.webhooks.events.event_body`), and only for an event some enabled webhook of the
bank subscribes to; a run that is not a bank's, or whose bank has no subscriber for its
events, costs one indexed read. Whatever the number of webhooks, the run's transaction
writes at most two rows. The worker (:mod:`heed.webhooks.worker`) then writes each event's
deliveries, one per subscribed webhook, in a transaction of its own
(:meth:`~heed.webhooks.store.WebhookStore.fan_out`), and sends them.

Why a hook of the run manager and not the run store writing the row itself: ``end_run`` is
already the one place every terminal transition goes through, with its transaction open
for the kind's own hook; a list of hooks for every kind there is three lines, keeps storage
unaware of webhooks, and serves kinds registered later (``mental_model_refresh``) as they
are.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, Final

from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, Conflict, InvalidInput, NotFound
from heed.runs.model import Run
from heed.runtime import run_in_thread
from heed.webhooks.events import (
    EVENT_TYPES,
    NOT_IMPLEMENTED,
    bank_ref_of,
    event_body,
    event_id,
    events_of,
)
from heed.webhooks.models import Delivery, Event, HttpConfig, Webhook
from heed.webhooks.store import WebhookStore
from heed.webhooks.targets import check_target

__all__ = ["MAX_HEADERS", "RESERVED_HEADERS", "WebhookChanges", "Webhooks"]

MAX_HEADERS: Final = 20
MAX_SECRET_CHARS: Final = 512
MIN_SECRET_CHARS: Final = 8
#: Headers a webhook's config may not set: heed's own and the transport's.
RESERVED_HEADERS: Final = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "user-agent"}
)
_TOKEN: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_UNSET: Final[Any] = object()


# No generated repr: it would show the secret.
@dataclass(eq=False, repr=False)
class WebhookChanges:
    """The fields an update names (each ``_UNSET`` when not given)."""

    url: str | None = _UNSET
    secret: str | None = _UNSET
    event_types: list[str] | None = _UNSET
    enabled: bool | None = _UNSET
    http_config: HttpConfig | None = _UNSET


def given(value: object) -> bool:
    """Whether an update field was given."""
    return value is not _UNSET


@dataclass(eq=False)
class Webhooks:
    """A bank's webhooks and their deliveries (see the module docstring)."""

    store: WebhookStore
    engine: MemoryEngine
    _: KW_ONLY
    allow_private: bool
    max_per_bank: int = 100

    def __post_init__(self) -> None:
        self.engine.before_delete.append(self._delete_bank)

    # -- subscriptions --------------------------------------------------------------

    async def create(
        self,
        bank: Bank,
        url: str,
        *,
        secret: str | None = None,
        event_types: list[str] | None = None,
        enabled: bool = True,
        http_config: HttpConfig | None = None,
    ) -> Webhook:
        """Register a webhook on *bank*; the returned one carries its secret (400 naming a
        bad field, the URL's address when refused; :class:`Conflict` when the bank already
        has :attr:`max_per_bank` webhooks)."""
        events = self._events(event_types)
        config = self._config(http_config or HttpConfig())
        await run_in_thread(check_target, url, self.allow_private)
        now = time.time()
        webhook = Webhook(
            id=_new_webhook_id(),
            tenant=bank.tenant,
            bank_ref=bank.ref,
            bank_id=bank.bank_id,
            url=url,
            secret=self._secret(secret),
            event_types=events,
            enabled=enabled,
            http_config=config,
            created_at=now,
            updated_at=now,
        )
        if not await run_in_thread(self.store.create, webhook, self.max_per_bank):
            raise Conflict(
                f"bank {bank.bank_id!r} already has {self.max_per_bank} webhooks, the most a "
                f"bank may have (HEED_WEBHOOK_MAX_PER_BANK={self.max_per_bank}); delete one "
                "first"
            )
        return webhook

    async def list_bank(self, bank: Bank, limit: int, offset: int) -> tuple[list[Webhook], int]:
        """``(page, total)`` of the bank's webhooks, oldest first."""
        return await run_in_thread(self.store.list_bank, bank.tenant, bank.ref, limit, offset)

    async def get(self, bank: Bank, webhook_id: str) -> Webhook:
        """The bank's webhook; :class:`NotFound` otherwise."""
        found = await run_in_thread(self.store.get, bank.tenant, bank.ref, webhook_id)
        if found is None:
            raise NotFound(f"webhook {webhook_id!r} not found")
        return found

    async def update(self, bank: Bank, webhook_id: str, changes: WebhookChanges) -> Webhook:
        """Change the fields *changes* names (a field given as null keeps its value)."""
        webhook = await self.get(bank, webhook_id)
        fields: dict[str, Any] = {}
        if given(changes.url) and changes.url is not None:
            await run_in_thread(check_target, changes.url, self.allow_private)
            fields["url"] = changes.url
        if given(changes.secret) and changes.secret is not None:
            fields["secret"] = self._secret(changes.secret)
        if given(changes.event_types) and changes.event_types is not None:
            fields["event_types"] = self._events(changes.event_types)
        if given(changes.enabled) and changes.enabled is not None:
            fields["enabled"] = changes.enabled
        if given(changes.http_config) and changes.http_config is not None:
            fields["http_config"] = self._config(changes.http_config)
        updated = replace(webhook, **fields, updated_at=time.time())
        if not await run_in_thread(self.store.update, updated):
            raise NotFound(f"webhook {webhook_id!r} not found")
        return updated

    async def delete(self, bank: Bank, webhook_id: str) -> None:
        """Delete the webhook and its delivery log; :class:`NotFound` when absent."""
        if not await run_in_thread(self.store.delete, bank.tenant, bank.ref, webhook_id):
            raise NotFound(f"webhook {webhook_id!r} not found")

    async def deliveries(
        self, bank: Bank, webhook_id: str, limit: int, cursor: str | None
    ) -> tuple[list[Delivery], str | None]:
        """The webhook's deliveries, newest first, and the cursor of the next page."""
        await self.get(bank, webhook_id)
        before = _parse_cursor(cursor) if cursor else None
        page = await run_in_thread(
            self.store.deliveries, bank.tenant, bank.ref, webhook_id, limit + 1, before
        )
        more = len(page) > limit
        page = page[:limit]
        next_cursor = f"{page[-1].created_at!r}|{page[-1].id}" if more and page else None
        return page, next_cursor

    async def _delete_bank(self, bank: Bank) -> None:
        await run_in_thread(self.store.delete_bank, bank.tenant, bank.ref)

    # -- bank transfer (the archive's webhooks section, heed.transfer; blocking) --

    def bank_webhooks(self, bank: Bank) -> list[Webhook]:
        """Every webhook of *bank*, oldest first, secrets included (an export's)."""
        found: list[Webhook] = []
        while True:
            page, total = self.store.list_bank(bank.tenant, bank.ref, 100, len(found))
            found.extend(page)
            if not page or len(found) >= total:
                return found

    def check_carried(self, webhooks: list[Webhook]) -> None:
        """Refuse a carried webhook (one an archive holds: its ``tenant``, ``bank_ref``
        and ``bank_id`` unset) the API would refuse (the same rules as :meth:`create`),
        naming it, and more webhooks than a bank may have: an import's check."""
        if len(webhooks) > self.max_per_bank:
            raise InvalidInput(
                f"{len(webhooks)} webhooks; a bank may have at most {self.max_per_bank} "
                f"(HEED_WEBHOOK_MAX_PER_BANK={self.max_per_bank})"
            )
        for webhook in webhooks:
            try:
                self._events(webhook.event_types)
                self._secret(webhook.secret)
                self._config(webhook.http_config)
                check_target(webhook.url, self.allow_private)
            except InvalidInput as exc:
                raise InvalidInput(f"webhook {webhook.id[:100]!r}: {exc.message}") from exc

    def stage_carried(self, webhooks: list[Webhook], bank: Bank) -> int:
        """Store carried *webhooks* as *bank*'s, each under a new id (ids are global);
        their secrets, events, config and timestamps as they were (after
        :meth:`check_carried`)."""
        for webhook in webhooks:
            self.store.create(
                replace(
                    webhook,
                    id=_new_webhook_id(),
                    tenant=bank.tenant,
                    bank_ref=bank.ref,
                    bank_id=bank.bank_id,
                    event_types=self._events(webhook.event_types),
                    http_config=self._config(webhook.http_config),
                )
            )
        return len(webhooks)

    def discard_carried(self, bank_ref: str) -> None:
        """Delete the webhooks staged for *bank_ref* (an import that did not publish)."""
        self.store.delete_ref(bank_ref)

    # -- the outbox ------------------------------------------------------------------

    def on_terminal(self, run: Run) -> None:
        """The run manager's terminal hook: store *run*'s events that some enabled webhook
        of its bank subscribes to, in the transaction that ends it (see the module
        docstring): at most two small rows. Blocking; raises only what the store raises."""
        ref = bank_ref_of(run)
        if ref is None:
            return
        subscribers = [w for w in self.store.subscribers(run.tenant, ref) if w.enabled]
        wanted = {name for w in subscribers for name in w.event_types}
        now = time.time()
        events = [
            Event(
                id=event_id(run, name),
                tenant=run.tenant,
                bank_ref=ref,
                event_type=name,
                body=event_body(name, run, subscribers[0].bank_id, now),
                created_at=now,
            )
            for name in events_of(run)
            if name in wanted
        ]
        if events:
            self.store.add_events(events)

    # -- the rules -------------------------------------------------------------------

    @staticmethod
    def _events(event_types: list[str] | None) -> list[str]:
        if event_types is None:
            return list(EVENT_TYPES)
        if not event_types:
            raise InvalidInput(
                f"event_types is empty: name one or more of {', '.join(EVENT_TYPES)}"
            )
        for name in event_types:
            if name in NOT_IMPLEMENTED:
                raise InvalidInput(f"event type {name!r} is not sent by heed")
            if name not in EVENT_TYPES:
                raise InvalidInput(f"event type {name!r} is unknown: use {', '.join(EVENT_TYPES)}")
        return list(dict.fromkeys(event_types))

    @staticmethod
    def _secret(secret: str | None) -> str:
        if secret is None:
            return "whsec_" + secrets.token_urlsafe(32)
        if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
            raise InvalidInput(
                f"secret has {len(secret)} characters; it must have "
                f"{MIN_SECRET_CHARS} to {MAX_SECRET_CHARS}"
            )
        return secret

    @staticmethod
    def _config(config: HttpConfig) -> HttpConfig:
        if config.method.upper() != "POST":
            raise InvalidInput(
                f"http_config.method {config.method!r} is not supported: heed sends POST"
            )
        if not 1 <= config.timeout_seconds <= 60:
            raise InvalidInput(
                f"http_config.timeout_seconds {config.timeout_seconds} must be 1 to 60"
            )
        for what, values in (("headers", config.headers), ("params", config.params)):
            if len(values) > MAX_HEADERS:
                raise InvalidInput(
                    f"http_config.{what} has {len(values)} entries; the limit is {MAX_HEADERS}"
                )
        for name, value in config.headers.items():
            lowered = name.lower()
            if not _TOKEN.match(name):
                raise InvalidInput(f"http_config.headers: {name!r} is not a header name")
            if lowered in RESERVED_HEADERS or lowered.startswith("x-heed-"):
                raise InvalidInput(f"http_config.headers: {name!r} is set by heed")
            if any(c in value for c in "\r\n\0"):
                raise InvalidInput(f"http_config.headers: the value of {name!r} holds a line break")
        return replace(config, method="POST")


def _parse_cursor(cursor: str) -> tuple[float, str]:
    at, sep, ident = cursor.partition("|")
    try:
        if not sep:
            raise ValueError
        return float(at), ident
    except ValueError:
        raise InvalidInput(f"cursor {cursor!r} is not one this server gave") from None


def _new_webhook_id() -> str:
    """A new webhook id: ``wh_`` and 24 random hex digits (ids are global, not per bank)."""
    return "wh_" + uuid.uuid4().hex[:24]
