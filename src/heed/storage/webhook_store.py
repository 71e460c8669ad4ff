"""The SQL implementation of :class:`heed.webhooks.store.WebhookStore` (component
``webhooks``), on SQLite or PostgreSQL (any :class:`~heed.storage.database.SqlDatabase`).

Three tables: ``webhooks`` (a bank's subscriptions, keyed by the bank's ref so a bank
deleted and created again starts with none), ``webhook_events`` (the end of a run as its
subscribers are told it: one row per run and event type, its body stored once) and
``webhook_deliveries`` (the outbox and its log: one row per webhook and event, pointing to
the event). ``add_events`` and ``subscribers`` use ``db.write()`` / ``db.read()``, which
join a transaction the calling thread has open: called from the run manager's terminal
hook, the events commit with the run's terminal row. :meth:`SqlWebhookStore.fan_out` writes
an event's deliveries later, in a transaction of its own.

A webhook's log is kept short: when a delivery is written, the webhook's finished
deliveries older than its newest *keep* (by ``seq``, a per-webhook counter) are deleted in
the same transaction; :meth:`SqlWebhookStore.prune` deletes finished deliveries whose last
try is older than the retention. An event goes with its last delivery.

A claim is a guarded ``UPDATE ... WHERE status = 'pending' AND (lease_until IS NULL OR
lease_until < now)``: on PostgreSQL (``READ COMMITTED``) a second updater waits for the
first's row lock and re-checks the condition, which no longer holds; on SQLite the writer
lock serialises them. Either way one claim matches and the others match nothing. A try is
recorded by an update guarded by the lease owner.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Final

from heed.storage.database import Migration, SqlStore, from_row
from heed.webhooks.models import PENDING, Delivery, Event, HttpConfig, Webhook

__all__ = ["MIGRATIONS", "SqlWebhookStore"]

#: Timestamps are epoch seconds (``{real}``).
MIGRATIONS: Final = [
    Migration(
        "webhooks",
        1,
        """
        CREATE TABLE webhooks (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_ref TEXT NOT NULL,
            bank_id TEXT NOT NULL,
            url TEXT NOT NULL,
            secret TEXT NOT NULL,
            event_types TEXT NOT NULL,
            enabled INTEGER NOT NULL,
            http_config TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        );
        CREATE INDEX webhooks_bank ON webhooks (tenant, bank_ref, created_at);
        CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_ref TEXT NOT NULL,
            webhook_id TEXT NOT NULL,
            event_id TEXT NOT NULL,
            event_type TEXT NOT NULL,
            url TEXT NOT NULL,
            body TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at {real} NOT NULL,
            lease_owner TEXT,
            lease_until {real},
            last_error TEXT,
            last_response_status INTEGER,
            last_response_body TEXT,
            last_attempt_at {real},
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL,
            UNIQUE (webhook_id, event_id)
        );
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
        CREATE INDEX webhook_deliveries_log ON webhook_deliveries (webhook_id, created_at, id);
        """,
    ),
    # An event's body is stored once, in webhook_events, and its deliveries point to it
    # (each delivery used to carry its own copy of the run's whole result); a per-webhook
    # seq orders a webhook's deliveries so its log can be cut to the newest ones.
    Migration(
        "webhooks",
        2,
        """
        CREATE TABLE webhook_events (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_ref TEXT NOT NULL,
            event_type TEXT NOT NULL,
            body TEXT NOT NULL,
            fanned_out INTEGER NOT NULL DEFAULT 0,
            created_at {real} NOT NULL
        );
        CREATE INDEX webhook_events_pending ON webhook_events (fanned_out, created_at);
        CREATE INDEX webhook_events_bank ON webhook_events (tenant, bank_ref);
        INSERT INTO webhook_events
            (id, tenant, bank_ref, event_type, body, fanned_out, created_at)
            SELECT event_id, MIN(tenant), MIN(bank_ref), MIN(event_type), MIN(body), 1,
                MIN(created_at)
            FROM webhook_deliveries GROUP BY event_id;
        ALTER TABLE webhook_deliveries DROP COLUMN body;
        ALTER TABLE webhook_deliveries ADD COLUMN seq {bigint} NOT NULL DEFAULT 0;
        CREATE INDEX webhook_deliveries_seq ON webhook_deliveries (webhook_id, seq);
        CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
        """,
    ),
]

_WEBHOOK_COLUMNS: Final = (
    "id, tenant, bank_ref, bank_id, url, secret, event_types, enabled, http_config, "
    "created_at, updated_at"
)
_DELIVERY_COLUMNS: Final = (
    "id, tenant, bank_ref, webhook_id, event_id, event_type, url, status, attempts, "
    "next_attempt_at, lease_owner, lease_until, last_error, last_response_status, "
    "last_response_body, last_attempt_at, created_at, updated_at, seq"
)
_EVENT_COLUMNS: Final = "id, tenant, bank_ref, event_type, body, fanned_out, created_at"
#: A delivery's finished statuses (what the log keeps, and prunes).
_FINISHED_SQL: Final = "status <> 'pending'"
#: The fields a try may set (:meth:`SqlWebhookStore.finish`).
_FINISH_FIELDS: Final = frozenset(
    {
        "status",
        "attempts",
        "next_attempt_at",
        "last_error",
        "last_response_status",
        "last_response_body",
        "last_attempt_at",
        "updated_at",
    }
)


def _config_json(config: HttpConfig) -> str:
    return json.dumps(
        {
            "method": config.method,
            "timeout_seconds": config.timeout_seconds,
            "headers": config.headers,
            "params": config.params,
        }
    )


def _webhook(row: Any) -> Webhook:
    config = json.loads(row["http_config"])
    return from_row(
        Webhook,
        row,
        event_types=json.loads(row["event_types"]),
        enabled=bool(row["enabled"]),
        http_config=HttpConfig(
            method=config["method"],
            timeout_seconds=int(config["timeout_seconds"]),
            headers=dict(config["headers"]),
            params=dict(config["params"]),
        ),
    )


def _delivery(row: Any) -> Delivery:
    return from_row(Delivery, row)


def _event(row: Any) -> Event:
    return from_row(Event, row, fanned_out=bool(row["fanned_out"]))


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


class SqlWebhookStore(SqlStore):
    """Webhooks and their deliveries on a :class:`~heed.storage.database.SqlDatabase`."""

    migrations = MIGRATIONS

    # -- webhooks --------------------------------------------------------------------

    def create(self, webhook: Webhook, limit: int | None = None) -> bool:
        with self.db.write() as conn:
            if limit is not None:
                # Count and insert under the bank's lock: two creates at once cannot both
                # pass a count of limit - 1.
                self.db.lock(conn, f"webhooks:{webhook.tenant}:{webhook.bank_ref}")
                (count,) = conn.execute(
                    "SELECT COUNT(*) FROM webhooks WHERE tenant = ? AND bank_ref = ?",
                    (webhook.tenant, webhook.bank_ref),
                ).fetchone()
                if int(count) >= limit:
                    return False
            conn.execute(
                f"INSERT INTO webhooks ({_WEBHOOK_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._webhook_row(webhook),
            )
        return True

    @staticmethod
    def _webhook_row(webhook: Webhook) -> tuple[Any, ...]:
        return (
            webhook.id,
            webhook.tenant,
            webhook.bank_ref,
            webhook.bank_id,
            webhook.url,
            webhook.secret,
            json.dumps(webhook.event_types),
            int(webhook.enabled),
            _config_json(webhook.http_config),
            webhook.created_at,
            webhook.updated_at,
        )

    def get(self, tenant: str, bank_ref: str, webhook_id: str) -> Webhook | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks "
                "WHERE id = ? AND tenant = ? AND bank_ref = ?",
                (webhook_id, tenant, bank_ref),
            ).fetchone()
        return _webhook(row) if row is not None else None

    def get_by_id(self, webhook_id: str) -> Webhook | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks WHERE id = ?", (webhook_id,)
            ).fetchone()
        return _webhook(row) if row is not None else None

    def list_bank(
        self, tenant: str, bank_ref: str, limit: int, offset: int
    ) -> tuple[list[Webhook], int]:
        with self.db.read() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM webhooks WHERE tenant = ? AND bank_ref = ?",
                (tenant, bank_ref),
            ).fetchone()[0]
            rows = conn.execute(
                f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks WHERE tenant = ? AND bank_ref = ? "
                "ORDER BY created_at, id LIMIT ? OFFSET ?",
                (tenant, bank_ref, limit, offset),
            ).fetchall()
        return [_webhook(r) for r in rows], int(total)

    def update(self, webhook: Webhook) -> bool:
        row = self._webhook_row(webhook)
        with self.db.write() as conn:
            changed = conn.execute(
                "UPDATE webhooks SET url = ?, secret = ?, event_types = ?, enabled = ?, "
                "http_config = ?, updated_at = ? WHERE id = ? AND tenant = ? AND bank_ref = ?",
                (*row[4:9], row[10], webhook.id, webhook.tenant, webhook.bank_ref),
            ).rowcount
        return int(changed) > 0

    def delete(self, tenant: str, bank_ref: str, webhook_id: str) -> bool:
        with self.db.write() as conn:
            gone = conn.execute(
                "DELETE FROM webhooks WHERE id = ? AND tenant = ? AND bank_ref = ?",
                (webhook_id, tenant, bank_ref),
            ).rowcount
            if gone:
                events = conn.execute(
                    "DELETE FROM webhook_deliveries WHERE webhook_id = ? RETURNING event_id",
                    (webhook_id,),
                ).fetchall()
                self._drop_orphans(conn, [r[0] for r in events])
        return int(gone) > 0

    def delete_bank(self, tenant: str, bank_ref: str) -> int:
        with self.db.write() as conn:
            for table in ("webhook_deliveries", "webhook_events"):
                conn.execute(
                    f"DELETE FROM {table} WHERE tenant = ? AND bank_ref = ?", (tenant, bank_ref)
                )
            return int(
                conn.execute(
                    "DELETE FROM webhooks WHERE tenant = ? AND bank_ref = ?", (tenant, bank_ref)
                ).rowcount
            )

    def delete_ref(self, bank_ref: str) -> int:
        with self.db.write() as conn:
            for table in ("webhook_deliveries", "webhook_events"):
                conn.execute(f"DELETE FROM {table} WHERE bank_ref = ?", (bank_ref,))
            return int(
                conn.execute("DELETE FROM webhooks WHERE bank_ref = ?", (bank_ref,)).rowcount
            )

    # -- the outbox ------------------------------------------------------------------

    def subscribers(self, tenant: str, bank_ref: str) -> list[Webhook]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks "
                "WHERE tenant = ? AND bank_ref = ? AND enabled = 1 ORDER BY created_at, id",
                (tenant, bank_ref),
            ).fetchall()
        return [_webhook(r) for r in rows]

    def add_events(self, events: list[Event]) -> None:
        with self.db.write() as conn:
            for event in events:
                conn.execute(
                    f"INSERT INTO webhook_events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO NOTHING",
                    (
                        event.id,
                        event.tenant,
                        event.bank_ref,
                        event.event_type,
                        event.body,
                        int(event.fanned_out),
                        event.created_at,
                    ),
                )

    def pending_events(self, per_tenant: int, limit: int) -> list[Event]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM ("
                f"  SELECT {_EVENT_COLUMNS}, ROW_NUMBER() OVER ("
                "    PARTITION BY tenant ORDER BY created_at, id) AS turn"
                "  FROM webhook_events WHERE fanned_out = 0"
                ") ranked WHERE turn <= ? ORDER BY turn, created_at, id LIMIT ?",
                (per_tenant, limit),
            ).fetchall()
        return [_event(r) for r in rows]

    def fan_out(self, event_id: str, now: float, keep: int) -> int:
        with self.db.write() as conn:
            claimed = conn.execute(
                "UPDATE webhook_events SET fanned_out = 1 WHERE id = ? AND fanned_out = 0",
                (event_id,),
            ).rowcount
            if not claimed:
                return 0  # another instance did it, or the event is gone
            event = _event(
                conn.execute(
                    f"SELECT {_EVENT_COLUMNS} FROM webhook_events WHERE id = ?", (event_id,)
                ).fetchone()
            )
            hooks = [
                w
                for w in self.subscribers(event.tenant, event.bank_ref)
                if event.event_type in w.event_types
            ]
            if not hooks:
                conn.execute("DELETE FROM webhook_events WHERE id = ?", (event_id,))
                return 0
            dropped: list[str] = []
            for hook in hooks:
                (last,) = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM webhook_deliveries WHERE webhook_id = ?",
                    (hook.id,),
                ).fetchone()
                seq = int(last) + 1
                self.enqueue(
                    [
                        Delivery(
                            id="whd_" + uuid.uuid4().hex[:24],
                            tenant=event.tenant,
                            bank_ref=event.bank_ref,
                            webhook_id=hook.id,
                            event_id=event.id,
                            event_type=event.event_type,
                            url=hook.url,
                            status=PENDING,
                            attempts=0,
                            next_attempt_at=now,
                            created_at=now,
                            updated_at=now,
                            seq=seq,
                        )
                    ]
                )
                dropped += [
                    r[0]
                    for r in conn.execute(
                        "DELETE FROM webhook_deliveries WHERE webhook_id = ? AND seq <= ? "
                        f"AND {_FINISHED_SQL} RETURNING event_id",
                        (hook.id, seq - keep),
                    ).fetchall()
                ]
            self._drop_orphans(conn, dropped)
        return len(hooks)

    def enqueue(self, deliveries: list[Delivery]) -> None:
        columns = _DELIVERY_COLUMNS.split(", ")
        with self.db.write() as conn:
            for delivery in deliveries:
                conn.execute(
                    f"INSERT INTO webhook_deliveries ({_DELIVERY_COLUMNS}) "
                    f"VALUES ({_marks(columns)}) ON CONFLICT (webhook_id, event_id) DO NOTHING",
                    tuple(getattr(delivery, c) for c in columns),
                )

    def event_body(self, event_id: str) -> str | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT body FROM webhook_events WHERE id = ?", (event_id,)
            ).fetchone()
        return str(row[0]) if row is not None else None

    def due(
        self,
        now: float,
        limit: int,
        skip_tenants: Sequence[str] = (),
        skip_webhooks: Sequence[str] = (),
    ) -> list[Delivery]:
        sql = (
            f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries "
            "WHERE status = ? AND next_attempt_at <= ? "
            "AND (lease_until IS NULL OR lease_until < ?)"
        )
        args: list[Any] = [PENDING, now, now]
        if skip_tenants:
            sql += f" AND tenant NOT IN ({_marks(skip_tenants)})"
            args += skip_tenants
        if skip_webhooks:
            sql += f" AND webhook_id NOT IN ({_marks(skip_webhooks)})"
            args += skip_webhooks
        sql += " ORDER BY next_attempt_at, id LIMIT ?"
        args.append(limit)
        with self.db.read() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [_delivery(r) for r in rows]

    def prune(self, before: float, batch: int) -> int:
        with self.db.write() as conn:
            events = conn.execute(
                "DELETE FROM webhook_deliveries WHERE id IN ("
                "  SELECT id FROM webhook_deliveries WHERE status IN ('delivered', 'failed')"
                "  AND next_attempt_at < ? LIMIT ?"
                ") RETURNING event_id",
                (before, batch),
            ).fetchall()
            self._drop_orphans(conn, [r[0] for r in events])
            conn.execute(
                "DELETE FROM webhook_events WHERE id IN ("
                "  SELECT e.id FROM webhook_events e WHERE e.fanned_out = 1"
                "  AND e.created_at < ? AND NOT EXISTS ("
                "    SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id"
                "  ) LIMIT ?"
                ")",
                (before, batch),
            )
        return len(events)

    @staticmethod
    def _drop_orphans(conn: Any, event_ids: list[str]) -> None:
        """Delete the events among *event_ids* (fanned out) that no delivery points to."""
        for start in range(0, len(event_ids), 500):
            ids = sorted(set(event_ids[start : start + 500]))
            conn.execute(
                f"DELETE FROM webhook_events WHERE id IN ({_marks(ids)}) AND fanned_out = 1 "
                "AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d "
                "WHERE d.event_id = webhook_events.id)",
                ids,
            )

    def claim(self, delivery_id: str, owner: str, now: float, lease_until: float) -> bool:
        with self.db.write() as conn:
            claimed = conn.execute(
                "UPDATE webhook_deliveries SET lease_owner = ?, lease_until = ? "
                "WHERE id = ? AND status = ? AND next_attempt_at <= ? "
                "AND (lease_until IS NULL OR lease_until < ?)",
                (owner, lease_until, delivery_id, PENDING, now, now),
            ).rowcount
        return int(claimed) == 1

    def claim_many(
        self, delivery_ids: Sequence[str], owner: str, now: float, lease_until: float
    ) -> set[str]:
        if not delivery_ids:
            return set()
        # PostgreSQL: rows another instance is claiming are skipped, not waited for (and two
        # claims of overlapping sets cannot deadlock); SQLite's writer lock serialises them.
        skip = self.db.skip_locked
        with self.db.write() as conn:
            rows = conn.execute(
                "UPDATE webhook_deliveries SET lease_owner = ?, lease_until = ? WHERE id IN ("
                f"  SELECT id FROM webhook_deliveries WHERE id IN ({_marks(delivery_ids)})"
                "  AND status = ? AND next_attempt_at <= ?"
                f"  AND (lease_until IS NULL OR lease_until < ?) ORDER BY id{skip}"
                ") RETURNING id",
                (owner, lease_until, *delivery_ids, PENDING, now, now),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def finish(self, delivery_id: str, owner: str, fields: dict[str, Any]) -> bool:
        unknown = set(fields) - _FINISH_FIELDS
        if unknown:
            raise ValueError(f"not a field a try sets: {sorted(unknown)}")
        names = sorted(fields)
        assignments = ", ".join(f"{name} = ?" for name in names)
        with self.db.write() as conn:
            done = conn.execute(
                f"UPDATE webhook_deliveries SET {assignments}, lease_owner = NULL, "
                "lease_until = NULL WHERE id = ? AND lease_owner = ? AND status = ?",
                (*(fields[n] for n in names), delivery_id, owner, PENDING),
            ).rowcount
        return int(done) == 1

    def release(self, delivery_id: str, owner: str) -> None:
        with self.db.write() as conn:
            conn.execute(
                "UPDATE webhook_deliveries SET lease_owner = NULL, lease_until = NULL "
                "WHERE id = ? AND lease_owner = ?",
                (delivery_id, owner),
            )

    def deliveries(
        self,
        tenant: str,
        bank_ref: str,
        webhook_id: str,
        limit: int,
        before: tuple[float, str] | None,
    ) -> list[Delivery]:
        sql = (
            f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries "
            "WHERE webhook_id = ? AND tenant = ? AND bank_ref = ?"
        )
        args: list[Any] = [webhook_id, tenant, bank_ref]
        if before is not None:
            sql += " AND (created_at < ? OR (created_at = ? AND id < ?))"
            args += [before[0], before[0], before[1]]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        args.append(limit)
        with self.db.read() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [_delivery(r) for r in rows]

    def get_delivery(self, delivery_id: str) -> Delivery | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = ?",
                (delivery_id,),
            ).fetchone()
        return _delivery(row) if row is not None else None
