"""A :class:`~heed.runs.broker.Broker` over Redis pub/sub, for heed running as several processes.

The model
---------

Broker messages are *hints*: everything published was committed to the database
first, and a reader that misses one re-reads the journal (see
:mod:`heed.runs.broker` and :mod:`heed.runs.journal`). Redis pub/sub fits that:
it is fire-and-forget and loses what it cannot deliver; this module only has to
make every such loss *visible* to the readers it can affect, as
:data:`~heed.runs.broker.LAGGED`.

A :class:`RedisBroker` is one process's view of the shared bus:

- **Local fast path.** It composes an :class:`~heed.runs.broker.InProcessBroker`.
  :meth:`RedisBroker.publish` delivers to this process's subscribers at once
  through it, exactly as :class:`~heed.runs.broker.InProcessBroker` would, *and*
  sends the message to Redis tagged with the broker's :attr:`~RedisBroker.origin`
  (unique per instance). Messages that come back from Redis with this broker's
  own origin are ignored, so a local subscriber gets each message exactly once
  and in-process latency and semantics are unchanged.
- **Publishing never blocks.** ``publish`` encodes the message (the codec below)
  on the caller's thread and hands it to the broker's event loop
  (``loop.call_soon_threadsafe`` from another thread), into an outbox that one
  publisher task drains in order, pipelining the ``PUBLISH`` commands when
  several are queued. If Redis is unreachable the batch is dropped with a
  rate-limited warning; local delivery is unaffected. The outbox is bounded
  (``max_pending``): past it, new remote hints are dropped.
- **Subscriptions on demand.** One pub/sub connection per broker. A channel is
  ``SUBSCRIBE``\\d when the first local subscriber of its topic appears and
  ``UNSUBSCRIBE``\\d when the last one closes (a writer task reconciles the set
  of topics with subscribers against what was sent, so bursts coalesce). A
  reader task hands each message to the local subscribers of its topic.
  Messages from Redis reach a subscription only once Redis has confirmed the
  ``SUBSCRIBE`` (:meth:`RedisBroker.wait_subscribed`), usually well under a
  millisecond after :meth:`RedisBroker.subscribe`; hints published elsewhere
  in between are lost, which the journal's replay and poll cover.
- **Connection loss.** When the pub/sub connection breaks (the reader sees an
  error or end of stream, a send fails, or a ``PING`` sent every
  ``health_interval`` seconds gets no reply by the next one), the broker
  reconnects with capped, jittered exponential backoff, re-subscribes every
  topic that still has subscribers, and, once Redis has confirmed all of that,
  makes every live subscription return :data:`~heed.runs.broker.LAGGED` once
  (after whatever it had buffered): the readers re-read the journal, which
  closes the gap. Nothing is ever raised into subscribers.

Why a raw pub/sub connection rather than redis-py's ``PubSub``: ``PubSub`` reconnects
and re-subscribes on its own, so a reader could not learn that hints were lost while
it was away; here every loss is turned into ``LAGGED``.

Channel names are ``<prefix><topic>`` (``prefix`` defaults to ``"heed:"``), so
deployments -- and tests -- sharing one Redis isolate with distinct prefixes.
The two connections are named (``CLIENT SETNAME``) :attr:`RedisBroker.listener_name`
and :attr:`RedisBroker.publisher_name`, both starting with the prefix.

The codec
---------

Messages cross Redis as compact JSON objects carrying the origin ``"o"`` and a
kind ``"k"``:

- a :class:`~heed.runs.model.RunEvent` (topics ``run:<run_id>``) is
  ``{"k": "event", "run_id", "seq", "type", "ts", "data"}`` where ``data`` is the
  event's :attr:`~heed.runs.model.RunEvent.data_json` *text*, rebuilt as
  ``RunEvent(run_id, seq, type, ts=ts, data_json=data)``, so a stored payload is
  carried byte for byte and never re-encoded;
- a ``dict`` (topics ``session:<id>`` and ``runs:cancel``) is ``{"k": "json",
  "v": <the dict>}``; it must be JSON-able (keys become strings, tuples lists).

:meth:`RedisBroker.publish` raises :class:`TypeError` for any other message, or
a dict JSON cannot encode -- a programming error, raised before anything is
delivered. It raises nothing else.

Lifecycle
---------

``broker = RedisBroker(url, prefix=...)``, then ``await broker.start()`` on the
event loop that will run the broker's tasks (it fails fast with
:class:`RedisBrokerError` if Redis cannot be reached), and ``await
broker.aclose()`` on that loop at the end (idempotent). ``publish``, ``subscribe``
and the subscriptions' ``close`` / ``stop`` may be called from any thread (a
subscription's ``get`` runs on the loop it was created on). Before ``start`` and
after ``aclose`` the broker still delivers locally, but neither sends nor
receives through Redis; subscriptions made before ``start`` are subscribed on
Redis when it connects. Hints still in the outbox at ``aclose`` are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import threading
import time
import uuid
from collections import deque
from typing import Any, Final

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection, Connection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from heed.runs.broker import LAGGED, InProcessBroker, Subscription
from heed.runs.model import RunEvent
from heed.runtime import reraise_cancellation

__all__ = [
    "RedisBroker",
    "RedisBrokerError",
    "RedisSubscription",
    "decode_message",
    "encode_message",
]

log = logging.getLogger(__name__)

#: Most ``PUBLISH`` commands sent in one pipeline.
_BATCH: Final = 1000
#: Reconnect backoff: ``_BACKOFF_BASE * 2**failures`` seconds, at most ``_BACKOFF_MAX``,
#: times a random factor in [0.5, 1].
_BACKOFF_BASE: Final = 0.05
_BACKOFF_MAX: Final = 5.0
#: At most one warning of a kind per this many seconds (the rest are counted).
_WARN_INTERVAL: Final = 10.0
#: ``PING`` payloads on the pub/sub connection: the re-sync marker and the health check.
_RESYNC_PING: Final = "heed-broker-resync"
_HEALTH_PING: Final = "heed-broker-health"


class RedisBrokerError(ConnectionError):
    """:meth:`RedisBroker.start` could not reach Redis (the message says where and why)."""


class _Resync:
    """Queued to local subscriptions after a reconnect; their ``get`` turns it into LAGGED."""

    def __repr__(self) -> str:
        return "RESYNC"


_RESYNC: Final = _Resync()


# -- codec ---------------------------------------------------------------------------


def encode_message(message: object, origin: str) -> str:
    """The JSON text that carries *message* (from *origin*) over Redis.

    Raises :class:`TypeError` unless *message* is a
    :class:`~heed.runs.model.RunEvent` or a JSON-able ``dict``.
    """
    body: dict[str, Any]
    if not isinstance(message, RunEvent | dict):
        raise TypeError(
            f"RedisBroker carries RunEvent and dict messages, not {type(message).__name__}"
        )
    try:
        if isinstance(message, RunEvent):
            body = {
                "o": origin,
                "k": "event",
                "run_id": message.run_id,
                "seq": message.seq,
                "type": message.type,
                "ts": float(message.ts),
                "data": message.data_json,
            }
        else:
            body = {"o": origin, "k": "json", "v": message}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # not JSON-able, or a circular reference
        raise TypeError(f"RedisBroker cannot encode the message: {exc}") from exc


def decode_message(payload: bytes | str) -> tuple[str, object]:
    """``(origin, message)`` from what :func:`encode_message` wrote.

    Raises :class:`ValueError` for anything else (another writer on the channel).
    """
    try:
        body = json.loads(payload)
        origin = body["o"]
        kind = body["k"]
        if not isinstance(origin, str):
            raise ValueError("origin is not a string")
        if kind == "event":
            run_id, seq, type_ = body["run_id"], body["seq"], body["type"]
            ts, data = body["ts"], body["data"]
            if not (
                isinstance(run_id, str)
                and isinstance(seq, int)
                and not isinstance(seq, bool)
                and isinstance(type_, str)
                and isinstance(ts, int | float)
                and not isinstance(ts, bool)
                and isinstance(data, str)
            ):
                raise ValueError("malformed event fields")
            return origin, RunEvent(run_id, seq, type_, ts=float(ts), data_json=data)
        if kind == "json" and isinstance(body["v"], dict):
            return origin, body["v"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a RedisBroker message: {exc!r}") from exc
    raise ValueError(f"not a RedisBroker message (kind {kind!r})")


# -- helpers -------------------------------------------------------------------------


class _Throttled:
    """A warning logged at most once per interval; the rest are counted into the next one."""

    def __init__(self, interval: float = _WARN_INTERVAL) -> None:
        self._interval = interval
        self._last = -math.inf
        self._suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += f" ({self._suppressed} similar warnings suppressed)"
        log.warning(msg, *args)
        self._last = now
        self._suppressed = 0


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_MAX, _BACKOFF_BASE * 2**failures) * random.uniform(0.5, 1.0))


def _client_name(text: str) -> str:
    """*text* as a valid Redis client name (no spaces or control characters)."""
    return "".join(c if "!" <= c <= "~" else "_" for c in text)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _why(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _close_client(client: Redis) -> None:
    try:
        await client.aclose()
    except Exception as exc:
        reraise_cancellation(exc)
        log.debug("RedisBroker: error while closing the client", exc_info=True)


async def _disconnect(conn: AbstractConnection) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception as exc:
        reraise_cancellation(exc)
        log.debug("RedisBroker: error while closing a connection", exc_info=True)


# -- subscription --------------------------------------------------------------------


class RedisSubscription:
    """One subscriber's view of a topic (a :class:`~heed.runs.broker.Subscription`).

    It wraps a local subscription of the broker's
    :class:`~heed.runs.broker.InProcessBroker`, so buffering, ordering,
    :data:`~heed.runs.broker.LAGGED` on overflow and :meth:`stop` behave exactly
    as there; on top of that, a reconnect of the broker's pub/sub connection
    shows as one :data:`~heed.runs.broker.LAGGED`, and :meth:`close` releases
    the topic's Redis subscription when it was the last.
    """

    __slots__ = ("_broker", "_closed", "_inner", "topic")

    def __init__(self, broker: RedisBroker, topic: str, inner: Subscription) -> None:
        self._broker = broker
        self._inner = inner
        self._closed = False
        #: The topic subscribed to.
        self.topic = topic

    async def ready(self, wait_seconds: float = 1.0) -> bool:
        """Wait until Redis has confirmed the topic's subscription (at most *wait_seconds*):
        from then on, messages other processes publish reach this subscription."""
        return await self._broker.wait_subscribed(self.topic, wait_seconds)

    async def get(self, wait_seconds: float | None = None) -> object | None:
        """The next message, :data:`~heed.runs.broker.LAGGED`,
        :data:`~heed.runs.broker.STOPPED`, or ``None`` after *wait_seconds*."""
        message = await self._inner.get(wait_seconds)
        return LAGGED if message is _RESYNC else message

    def get_nowait(self) -> object | None:
        """Like :meth:`get` without waiting: ``None`` when nothing is ready."""
        message = self._inner.get_nowait()
        return LAGGED if message is _RESYNC else message

    def stop(self) -> None:
        """Make the next (or a pending) ``get`` return :data:`~heed.runs.broker.STOPPED`;
        any thread."""
        self._inner.stop()

    def close(self) -> None:
        """Stop receiving; idempotent, any thread."""
        if not self._closed:
            self._closed = True
            self._inner.close()
            self._broker._release(self.topic)


# -- broker --------------------------------------------------------------------------


class RedisBroker:
    """A :class:`~heed.runs.broker.Broker` shared by processes through Redis pub/sub.

    See the module docstring for the model. *url* is a redis-py URL
    (``redis://[user:password@]host:port/db``, ``rediss://``, ``unix://``);
    *prefix* starts every channel and connection name. *connect_timeout*
    bounds :meth:`start`, each connection attempt and each socket operation;
    *health_interval* is how often the idle pub/sub connection is pinged (a
    dead one is noticed within about twice that); *max_pending* bounds the
    outbox of hints not yet sent to Redis.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "heed:",
        connect_timeout: float = 5.0,
        health_interval: float = 15.0,
        max_pending: int = 10_000,
    ) -> None:
        options: dict[str, Any] = dict(parse_url(url))
        self._connection_class: type[AbstractConnection] = options.pop(
            "connection_class", Connection
        )
        self._options = options
        self._where = (
            str(options["path"])
            if "path" in options
            else f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
        )
        #: Starts every Redis channel (``<prefix><topic>``) and connection name.
        self.prefix = prefix
        #: Tags what this broker publishes, so it ignores its own messages coming back.
        self.origin = uuid.uuid4().hex
        # How encode_message() starts this broker's payloads: echoes skip the JSON decode.
        self._own = f'{{"o":{json.dumps(self.origin)},'.encode()
        #: ``CLIENT SETNAME`` of the pub/sub connection.
        self.listener_name = _client_name(f"{prefix}sub:{self.origin}")
        #: ``CLIENT SETNAME`` of the publishing connection(s).
        self.publisher_name = _client_name(f"{prefix}pub:{self.origin}")
        self._connect_timeout = connect_timeout
        self._health_interval = health_interval
        self._max_pending = max_pending

        self._local = InProcessBroker()
        self._lock = threading.Lock()  # guards _counts
        self._counts: dict[str, int] = {}  # topic -> local subscribers

        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._client: Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # The rest is used on the broker's loop only.
        self._outbox: deque[tuple[str, str]] = deque()
        self._outbox_ready = asyncio.Event()
        self._sync_wanted = asyncio.Event()
        self._sent: set[str] = set()  # topics SUBSCRIBEd on the current connection
        self._confirmed: set[str] = set()  # ... and confirmed by Redis
        self._confirmations = asyncio.Event()  # set (and replaced) when _confirmed changes
        self._resync_pending = False
        self._failures = 0
        self._last_rx = 0.0
        self._publish_warnings = _Throttled()
        self._listen_warnings = _Throttled()
        self._decode_warnings = _Throttled()

    def __repr__(self) -> str:
        return f"<RedisBroker {self._where} prefix={self.prefix!r} origin={self.origin[:8]}>"

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and start the publisher and pub/sub tasks on the running loop.

        Call it once, on the loop that will use the broker. Raises
        :class:`RedisBrokerError` if Redis cannot be reached within
        *connect_timeout* (nothing is left running then).
        """
        if self._loop is not None or self._closed:
            raise RuntimeError("RedisBroker.start() may be called once, before aclose()")
        loop = asyncio.get_running_loop()
        pool = ConnectionPool(
            connection_class=self._connection_class,
            **self._connection_options(self.publisher_name, retries=1),
        )
        client = Redis.from_pool(pool)
        listener: AbstractConnection | None = None
        ok = False
        try:
            async with asyncio.timeout(self._connect_timeout):
                await client.ping()
                listener = await self._open_listener()
            ok = True
        except Exception as exc:
            reraise_cancellation(exc)
            why = (
                f"no answer within {self._connect_timeout}s"
                if isinstance(exc, TimeoutError)
                else _why(exc)
            )
            raise RedisBrokerError(
                f"RedisBroker cannot reach Redis at {self._where}: {why}"
            ) from exc
        finally:
            if not ok:
                if listener is not None:
                    await _disconnect(listener)
                await _close_client(client)
        self._loop = loop
        self._client = client
        self._tasks = [
            loop.create_task(self._publish_loop(client), name=f"{self!r} publisher"),
            loop.create_task(self._listen_loop(listener), name=f"{self!r} listener"),
        ]

    async def aclose(self) -> None:
        """Stop the tasks and close the connections; idempotent. Call it on the broker's
        loop. Local delivery keeps working afterwards; Redis is no longer used."""
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        self._outbox_ready.set()  # the loops also check _closed when they wake
        self._sync_wanted.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._outbox.clear()
        client, self._client = self._client, None
        if client is not None:
            await _close_client(client)

    async def ping(self) -> None:
        """``PING`` Redis on the publishing connection; raises :class:`RedisBrokerError`
        naming the address when it does not answer (or before :meth:`start`, after
        :meth:`aclose`). The caller bounds the wait; a socket connect stops after
        *connect_timeout*."""
        client = self._client
        if client is None:
            raise RedisBrokerError(f"RedisBroker {self._where} is not connected")
        try:
            await client.ping()
        except Exception as exc:
            reraise_cancellation(exc)
            raise RedisBrokerError(
                f"RedisBroker cannot reach Redis at {self._where}: {_why(exc)}"
            ) from exc

    # -- the Broker interface ----------------------------------------------------------

    def publish(self, topic: str, message: object) -> None:
        """Deliver *message* to this process's subscribers of *topic* now, and queue it
        for the other processes through Redis.

        Never blocks; callable from any thread. Raises :class:`TypeError` (before
        delivering anything) unless *message* is a :class:`~heed.runs.model.RunEvent`
        or a JSON-able ``dict``; raises nothing else -- a hint Redis cannot take is
        dropped with a rate-limited warning.
        """
        payload = encode_message(message, self.origin)
        self._local.publish(topic, message)
        loop = self._loop
        if loop is None or self._closed:
            return
        channel = self.prefix + topic
        if _running_loop() is loop:
            self._enqueue(channel, payload)
            return
        with contextlib.suppress(RuntimeError):  # the broker's loop is closed: drop the hint
            loop.call_soon_threadsafe(self._enqueue, channel, payload)

    def subscribe(self, topic: str, *, maxsize: int = 4096) -> RedisSubscription:
        """A subscription to *topic*, receiving what this process and (once Redis has
        confirmed the channel, see :meth:`wait_subscribed`) other processes publish.

        Must be called on an event loop (any thread); messages are delivered on that
        loop. *maxsize* bounds its buffer, as for
        :meth:`~heed.runs.broker.InProcessBroker.subscribe`.
        """
        inner = self._local.subscribe(topic, maxsize=maxsize)
        with self._lock:
            count = self._counts.get(topic, 0) + 1
            self._counts[topic] = count
        if count == 1:
            self._want_sync()
        return RedisSubscription(self, topic, inner)

    def subscriber_count(self, topic: str) -> int:
        """How many open subscriptions to *topic* this broker has (in this process)."""
        return self._local.subscriber_count(topic)

    async def wait_subscribed(self, topic: str, wait_seconds: float = 5.0) -> bool:
        """Wait until Redis has confirmed this broker's subscription to *topic*, at most
        *wait_seconds*; ``True`` if it has. From then on, messages published to
        *topic* by other processes reach this broker's subscribers (until the
        connection drops). Call it on the broker's loop, after :meth:`start`."""
        if self._loop is None or self._closed:
            return False
        try:
            async with asyncio.timeout(wait_seconds):
                while topic not in self._confirmed:
                    await self._confirmations.wait()
        except TimeoutError:
            return False
        return True

    # -- subscriptions -----------------------------------------------------------------

    def _release(self, topic: str) -> None:
        """A subscription to *topic* closed (any thread)."""
        with self._lock:
            count = self._counts.get(topic, 0) - 1
            if count > 0:
                self._counts[topic] = count
            else:
                self._counts.pop(topic, None)
        if count <= 0:
            self._want_sync()

    def _want_sync(self) -> None:
        """Ask the pub/sub writer to reconcile Redis subscriptions (any thread)."""
        loop = self._loop
        if loop is None or self._closed:
            return  # start() subscribes whatever has subscribers by then
        if _running_loop() is loop:
            self._sync_wanted.set()
            return
        with contextlib.suppress(RuntimeError):  # the broker's loop is closed
            loop.call_soon_threadsafe(self._sync_wanted.set)

    def _topics(self) -> set[str]:
        with self._lock:
            return set(self._counts)

    # -- publishing (on the broker's loop) ---------------------------------------------

    def _enqueue(self, channel: str, payload: str) -> None:
        if self._closed:
            return
        if len(self._outbox) >= self._max_pending:
            self._publish_warnings.warning(
                "RedisBroker %s: %d hints waiting for Redis; dropping new ones",
                self._where,
                len(self._outbox),
            )
            return
        self._outbox.append((channel, payload))
        self._outbox_ready.set()

    async def _publish_loop(self, client: Redis) -> None:
        while not self._closed:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox and not self._closed:
                batch = [self._outbox.popleft() for _ in range(min(_BATCH, len(self._outbox)))]
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        if len(batch) == 1:
                            await client.publish(*batch[0])
                        else:
                            pipe = client.pipeline(transaction=False)
                            for channel, payload in batch:
                                pipe.publish(channel, payload)
                            await pipe.execute()
                except Exception as exc:  # noqa: BLE001 - a lost hint is logged, never raised
                    reraise_cancellation(exc)
                    self._publish_warnings.warning(
                        "RedisBroker %s: dropped %d hint(s) Redis did not take: %s",
                        self._where,
                        len(batch),
                        _why(exc),
                    )

    # -- the pub/sub connection (on the broker's loop) ---------------------------------

    def _connection_options(self, name: str, *, retries: int) -> dict[str, Any]:
        options = dict(self._options)
        options.update(
            client_name=name,
            retry=Retry(NoBackoff(), retries),
            socket_connect_timeout=self._connect_timeout,
            # No socket timeout: redis-py then sends through asyncio.wait_for, which on
            # Python 3.11 can swallow a cancellation. Every operation here runs under
            # asyncio.timeout(connect_timeout) instead (reads of pub/sub never time out).
            socket_timeout=None,
            health_check_interval=0,
            decode_responses=False,
            protocol=2,
        )
        return options

    async def _open_listener(self) -> AbstractConnection:
        """A new, connected pub/sub connection (never reused after it breaks)."""
        conn = self._connection_class(**self._connection_options(self.listener_name, retries=0))
        try:
            async with asyncio.timeout(self._connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            await _disconnect(conn)
            raise
        return conn

    async def _listen_loop(self, conn: AbstractConnection | None) -> None:
        """Serve pub/sub connections one after the other, for as long as the broker runs."""
        while not self._closed:
            if conn is None:
                try:
                    conn = await self._open_listener()
                except Exception as exc:  # noqa: BLE001 - logged; the loop retries
                    reraise_cancellation(exc)
                    self._failures += 1
                    delay = _backoff(self._failures)
                    self._listen_warnings.warning(
                        "RedisBroker %s: cannot reconnect pub/sub (%s); retrying in %.2fs",
                        self._where,
                        _why(exc),
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
            try:
                await self._serve(conn)
            except Exception as exc:  # noqa: BLE001 - logged; the loop reconnects
                reraise_cancellation(exc)
                self._listen_warnings.warning(
                    "RedisBroker %s: lost the pub/sub connection (%s); reconnecting",
                    self._where,
                    _why(exc),
                )
            finally:
                self._sent.clear()
                self._confirmed.clear()
                self._confirmed_changed()
            conn = None
            # Hints may have been lost: once re-subscribed, every live reader re-syncs.
            self._resync_pending = True
            self._failures += 1
            await asyncio.sleep(_backoff(self._failures))

    async def _serve(self, conn: AbstractConnection) -> None:
        """Read and write on *conn* until it breaks (raises what broke it)."""
        self._last_rx = asyncio.get_running_loop().time()
        reader = asyncio.create_task(self._read_loop(conn))
        writer = asyncio.create_task(self._write_loop(conn))
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            writer.cancel()
            # Closing the connection also ends a task whose cancellation got lost.
            await _disconnect(conn)
            self._sync_wanted.set()
            await asyncio.gather(reader, writer, return_exceptions=True)
        for task in done:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
        raise ConnectionError("the pub/sub connection ended")

    async def _send(self, conn: AbstractConnection, *args: str) -> None:
        # redis-py reconnects a closed connection on send; a new connection has none of
        # our subscriptions, so a closed one is treated as broken instead.
        if not conn.is_connected:
            raise ConnectionError("the pub/sub connection is closed")
        async with asyncio.timeout(self._connect_timeout):
            await conn.send_command(*args, check_health=False)

    async def _write_loop(self, conn: AbstractConnection) -> None:
        """Keep Redis subscribed to exactly the topics with subscribers; ping when idle."""
        loop = asyncio.get_running_loop()
        resync_sent = False
        ping_sent_at: float | None = None
        next_ping = loop.time() + self._health_interval
        while True:
            if self._closed or not conn.is_connected:
                raise ConnectionError("the pub/sub connection is closed")
            self._sync_wanted.clear()
            wanted = self._topics()
            add = sorted(wanted - self._sent)
            drop = sorted(self._sent - wanted)
            if add:
                await self._send(conn, "SUBSCRIBE", *(self.prefix + t for t in add))
                self._sent.update(add)
            if drop:
                await self._send(conn, "UNSUBSCRIBE", *(self.prefix + t for t in drop))
                self._sent.difference_update(drop)
            if self._resync_pending and not resync_sent:
                # Redis answers in order: the PONG comes after every SUBSCRIBE above.
                await self._send(conn, "PING", _RESYNC_PING)
                resync_sent = True
            try:
                async with asyncio.timeout(max(0.0, next_ping - loop.time())):
                    await self._sync_wanted.wait()
                continue
            except TimeoutError:
                pass
            if ping_sent_at is not None and self._last_rx < ping_sent_at:
                raise ConnectionError(f"no reply from Redis for {loop.time() - ping_sent_at:.1f}s")
            await self._send(conn, "PING", _HEALTH_PING)
            ping_sent_at = loop.time()
            next_ping = ping_sent_at + self._health_interval

    async def _read_loop(self, conn: AbstractConnection) -> None:
        loop = asyncio.get_running_loop()
        prefix = self.prefix.encode()
        resync = _RESYNC_PING.encode()
        while True:
            response = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
            self._last_rx = loop.time()
            if not isinstance(response, list) or len(response) < 2:
                continue
            kind = response[0]
            channel = response[1]
            if kind == b"message" and len(response) == 3:
                if isinstance(channel, bytes) and channel.startswith(prefix):
                    self._on_message(channel[len(prefix) :], response[2])
            elif kind == b"subscribe" or kind == b"unsubscribe":
                if isinstance(channel, bytes) and channel.startswith(prefix):
                    topic = channel[len(prefix) :].decode(errors="replace")
                    if kind == b"subscribe":
                        self._confirmed.add(topic)
                    else:
                        self._confirmed.discard(topic)
                    self._confirmed_changed()
            elif kind == b"pong" and channel == resync:
                self._resynced()

    def _on_message(self, topic: bytes, data: object) -> None:
        if isinstance(data, bytes) and data.startswith(self._own):
            return  # ours, already delivered locally by publish()
        try:
            if not isinstance(data, bytes | str):
                raise ValueError(f"unexpected payload type {type(data).__name__}")
            origin, message = decode_message(data)
            name = topic.decode()
        except ValueError as exc:
            self._decode_warnings.warning(
                "RedisBroker %s: ignored a message on %s%s: %s",
                self._where,
                self.prefix,
                topic.decode(errors="replace"),
                exc,
            )
            return
        if origin == self.origin:
            return  # ours, already delivered locally by publish()
        self._deliver(name, message)

    def _deliver(self, topic: str, message: object) -> None:
        try:
            self._local.publish(topic, message)
        except RuntimeError as exc:  # a subscriber's loop is closed
            self._decode_warnings.warning(
                "RedisBroker %s: could not deliver on %s: %s", self._where, topic, exc
            )

    def _confirmed_changed(self) -> None:
        self._confirmations.set()
        self._confirmations = asyncio.Event()

    def _resynced(self) -> None:
        """Re-subscribed after a reconnect: every live subscription re-syncs once."""
        self._resync_pending = False
        self._failures = 0
        topics = self._topics()
        for topic in topics:
            self._deliver(topic, _RESYNC)
        log.info(
            "RedisBroker %s: pub/sub reconnected; %d topic(s) re-subscribed",
            self._where,
            len(topics),
        )
