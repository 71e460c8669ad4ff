"""RedisBroker against a real Redis: two brokers with one unique prefix stand for two processes.

Redis is at ``HEED_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); the tests
fail when nothing answers there (nothing is skipped for lack of a service). The tests of
Redis going away start their own ``redis-server`` on a free port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from heed.runs.broker import LAGGED, STOPPED
from heed.runs.model import RunEvent
from heed.runs.redis_broker import (
    RedisBroker,
    RedisBrokerError,
    RedisSubscription,
    decode_message,
    encode_message,
)

REDIS_URL = os.environ.get("HEED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
WAIT = 10.0  # seconds: generous bound for anything that should take milliseconds


@pytest.fixture
async def admin() -> AsyncIterator[Redis]:
    """A plain client on the test Redis, to look at (and break) the brokers' connections."""
    client = Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        pytest.fail(f"no Redis at {REDIS_URL}: {exc}")
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"heed-test-{uuid.uuid4().hex}:"


@pytest.fixture
async def pair(admin: Redis, prefix: str) -> AsyncIterator[tuple[RedisBroker, RedisBroker]]:
    """Two started brokers sharing a prefix: process A and process B."""
    a = RedisBroker(REDIS_URL, prefix=prefix)
    b = RedisBroker(REDIS_URL, prefix=prefix)
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def subscribed(broker: RedisBroker, topic: str, *, maxsize: int = 4096) -> RedisSubscription:
    """A subscription whose Redis channel is confirmed, so other brokers' messages arrive."""
    sub = broker.subscribe(topic, maxsize=maxsize)
    assert await broker.wait_subscribed(topic, WAIT), f"{topic} not confirmed by Redis"
    return sub


async def receive(sub: RedisSubscription, n: int) -> list[object]:
    """The next *n* messages (each within WAIT seconds)."""
    got: list[object] = []
    for _ in range(n):
        message = await sub.get(WAIT)
        assert message is not None, f"timed out after {len(got)} of {n} messages"
        got.append(message)
    return got


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll *check* until it holds, failing after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def event(run_id: str, seq: int) -> RunEvent:
    return RunEvent(
        run_id,
        seq,
        "text_delta" if seq % 3 else "tool_call",
        {"i": seq, "text": "héllo ✓ " * (seq % 4), "nested": {"list": [seq, None, True, 0.5]}},
        ts=1_700_000_000.123456 + seq / 7,
    )


async def numsub(admin: Redis, channel: str) -> int:
    counts = dict(await admin.pubsub_numsub(channel))
    return int(counts[channel.encode()])


async def listener_ids(admin: Redis, broker: RedisBroker) -> list[str]:
    """Redis client ids of *broker*'s pub/sub connection (found by its client name)."""
    clients = await admin.client_list(_type="pubsub")
    return [c["id"] for c in clients if c.get("name") == broker.listener_name]


def seqs(messages: list[object]) -> list[int]:
    assert all(isinstance(m, RunEvent) for m in messages), messages
    return [m.seq for m in messages if isinstance(m, RunEvent)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- crossing between processes ----------------------------------------------------------


async def test_run_events_cross_in_publish_order_with_equal_fields(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    topic = "run:r1"
    sub = await subscribed(b, topic)
    sent = [event("r1", seq) for seq in range(1, 201)]
    for e in sent:
        a.publish(topic, e)
    got = await receive(sub, 200)
    events = [m for m in got if isinstance(m, RunEvent)]
    assert len(events) == 200
    assert [(m.run_id, m.seq, m.type, m.ts, m.data) for m in events] == [
        (e.run_id, e.seq, e.type, e.ts, e.data) for e in sent
    ]
    assert [m.data_json for m in events] == [e.data_json for e in sent]
    assert sub.get_nowait() is None
    sub.close()


async def test_a_local_subscriber_gets_each_message_exactly_once(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    topic = "run:r2"
    local = await subscribed(a, topic)  # A is subscribed on Redis too: its own messages echo
    remote = await subscribed(b, topic)
    first = event("r2", 1)
    a.publish(topic, first)
    assert local.get_nowait() == first  # the fast path: delivered before publish returned
    for seq in range(2, 201):
        a.publish(topic, event("r2", seq))
    assert seqs(await receive(local, 199)) == list(range(2, 201))
    # B has all 200 through Redis, so A's echoes of them are on A's connection before a
    # fence that B publishes now (one channel: Redis delivers in the order it received).
    assert seqs(await receive(remote, 200)) == list(range(1, 201))
    fence = {"type": "fence", "data": {"from": "b"}}
    b.publish(topic, fence)
    assert await receive(local, 1) == [fence]
    assert local.get_nowait() is None
    assert a.subscriber_count(topic) == 1


async def test_dict_messages_cross_on_session_and_cancel_topics(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    session = await subscribed(b, "session:s1")
    cancels = await subscribed(b, "runs:cancel")
    updated = {
        "type": "session_updated",
        "data": {"session_id": "s1", "title": "Ünïcode ✓", "busy": True, "n": 3, "x": None},
    }
    cancel = {"run_id": "run_abc", "reason": "user asked"}
    a.publish("session:s1", updated)
    a.publish("runs:cancel", cancel)
    a.publish("session:s1", {"type": "task_complete", "data": {"f": 1.25}})
    assert await receive(session, 2) == [updated, {"type": "task_complete", "data": {"f": 1.25}}]
    assert await receive(cancels, 1) == [cancel]


async def test_publish_rejects_what_the_codec_cannot_carry(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, _ = pair
    local = a.subscribe("session:s2")
    for bad in (["a", "list"], "text", object(), {"data": {1, 2}}):
        with pytest.raises(TypeError):
            a.publish("session:s2", bad)
    assert local.get_nowait() is None  # nothing was delivered, not even locally


def test_codec_round_trips_and_rejects_foreign_payloads() -> None:
    e = RunEvent("r", 7, "text_delta", ts=12.5, data_json='{"text":"é","n":[1,2]}')
    origin, back = decode_message(encode_message(e, "me"))
    assert origin == "me"
    assert isinstance(back, RunEvent)
    assert (back.run_id, back.seq, back.type, back.ts) == ("r", 7, "text_delta", 12.5)
    assert back.data_json == '{"text":"é","n":[1,2]}'
    assert decode_message(encode_message({"k": [1]}, "o2").encode()) == ("o2", {"k": [1]})
    for junk in (b"not json", b"[]", b'{"o":"x","k":"json","v":[1]}', b'{"o":"x","k":"event"}'):
        with pytest.raises(ValueError):
            decode_message(junk)


async def test_foreign_messages_on_a_channel_are_ignored(
    pair: tuple[RedisBroker, RedisBroker], admin: Redis, prefix: str
) -> None:
    a, b = pair
    sub = await subscribed(b, "session:s3")
    await admin.publish(f"{prefix}session:s3", b"\xff not ours")
    await admin.publish(f"{prefix}session:s3", b'{"o":"x","k":"what"}')
    a.publish("session:s3", {"type": "ok"})
    assert await receive(sub, 1) == [{"type": "ok"}]
    assert sub.get_nowait() is None


async def test_a_message_published_from_another_thread_arrives(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    topic = "run:r3"
    local = a.subscribe(topic)
    remote = await subscribed(b, topic)
    errors: list[BaseException] = []

    def publish_all() -> None:
        try:
            for seq in range(1, 51):
                a.publish(topic, event("r3", seq))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=publish_all)
    thread.start()
    await asyncio.to_thread(thread.join, WAIT)
    assert errors == []
    assert seqs(await receive(remote, 50)) == list(range(1, 51))
    assert seqs(await receive(local, 50)) == list(range(1, 51))


async def test_a_subscriber_on_another_threads_loop_receives(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    topic = "session:s5"
    ready = threading.Event()
    got: list[object] = []

    def reader() -> None:
        async def main() -> None:
            sub = b.subscribe(topic)  # on this thread's own loop
            ready.set()
            try:
                got.append(await sub.get(WAIT))
            finally:
                sub.close()

        asyncio.run(main())

    thread = threading.Thread(target=reader)
    thread.start()
    assert await asyncio.to_thread(ready.wait, WAIT)
    assert await b.wait_subscribed(topic, WAIT)
    a.publish(topic, {"type": "from_a"})
    await asyncio.to_thread(thread.join, WAIT)
    assert got == [{"type": "from_a"}]

    async def released() -> bool:
        return b.subscriber_count(topic) == 0 and not await b.wait_subscribed(topic, 0)

    await eventually(released, "the thread's subscription released")


async def test_before_start_delivery_is_local_and_start_subscribes_what_exists(
    admin: Redis, prefix: str
) -> None:
    a = RedisBroker(REDIS_URL, prefix=prefix)
    b = RedisBroker(REDIS_URL, prefix=prefix)
    try:
        early = b.subscribe("run:r8")
        b.publish("run:r8", event("r8", 1))
        assert early.get_nowait() == event("r8", 1)
        assert not await b.wait_subscribed("run:r8", 0)
        await a.start()
        await b.start()
        assert await b.wait_subscribed("run:r8", WAIT)
        a.publish("run:r8", event("r8", 2))
        assert await receive(early, 1) == [event("r8", 2)]
        with pytest.raises(RuntimeError):
            await b.start()
    finally:
        await a.aclose()
        await b.aclose()


async def test_aclose_is_prompt_even_right_after_a_subscribe(admin: Redis, prefix: str) -> None:
    # (A send to Redis under way when aclose cancels it must not survive the cancel.)
    started = time.monotonic()
    for i in range(20):
        broker = RedisBroker(REDIS_URL, prefix=prefix)
        await broker.start()
        await subscribed(broker, "run:r9")  # the broker's tasks are idle now
        broker.subscribe(f"run:r9-{i}")  # ... and about to send SUBSCRIBE
        broker.publish(f"run:r9-{i}", event("r9", 1))
        for _ in range(i % 4):
            await asyncio.sleep(0)  # let the sends start, by a varying amount
        async with asyncio.timeout(WAIT):
            await broker.aclose()
    assert time.monotonic() - started < WAIT


# -- the Subscription contract ------------------------------------------------------------


async def test_overflow_gives_lagged_once_then_later_messages(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    a, b = pair
    topic = "run:r4"
    small = await subscribed(b, topic, maxsize=5)
    big = b.subscribe(topic)  # same topic, same loop: sees the same deliveries
    for seq in range(1, 51):
        a.publish(topic, event("r4", seq))
    assert seqs(await receive(big, 50)) == list(range(1, 51))
    assert await small.get(WAIT) is LAGGED
    assert small.get_nowait() is None
    a.publish(topic, event("r4", 51))
    assert await receive(small, 1) == [event("r4", 51)]
    assert await receive(big, 1) == [event("r4", 51)]


async def test_stop_from_another_thread_ends_a_pending_get(
    pair: tuple[RedisBroker, RedisBroker],
) -> None:
    _, b = pair
    sub = await subscribed(b, "session:s4")
    pending = asyncio.create_task(sub.get(30))
    await asyncio.sleep(0)  # let the get start waiting
    assert not pending.done()
    thread = threading.Thread(target=sub.stop)
    thread.start()
    assert await asyncio.wait_for(pending, WAIT) is STOPPED
    await asyncio.to_thread(thread.join, WAIT)
    assert await sub.get(0) is STOPPED


async def test_redis_unsubscribes_when_the_last_subscriber_closes(
    pair: tuple[RedisBroker, RedisBroker], admin: Redis, prefix: str
) -> None:
    _, b = pair
    topic = "run:r5"
    channel = prefix + topic
    first = await subscribed(b, topic)
    second = b.subscribe(topic)
    assert await numsub(admin, channel) == 1  # one Redis subscription per broker
    first.close()
    first.close()  # idempotent
    # Subscriptions are reconciled in order: once another topic is confirmed, a wrongful
    # UNSUBSCRIBE of this one would have been processed too.
    other = await subscribed(b, "run:other")
    assert await numsub(admin, channel) == 1
    assert b.subscriber_count(topic) == 1
    second.close()
    assert b.subscriber_count(topic) == 0

    async def gone() -> bool:
        return await numsub(admin, channel) == 0

    await eventually(gone, f"no subscriber on {channel}")
    assert await numsub(admin, prefix + "run:other") == 1
    other.close()
    again = await subscribed(b, topic)  # and it can come back
    assert await numsub(admin, channel) == 1
    again.close()


# -- failures ---------------------------------------------------------------------------


async def test_losing_the_pubsub_connection_lags_then_recovers(
    pair: tuple[RedisBroker, RedisBroker], admin: Redis
) -> None:
    a, b = pair
    topic = "run:r6"
    sub = await subscribed(b, topic)
    quiet = await subscribed(b, "session:s6")
    a.publish(topic, event("r6", 1))
    assert await receive(sub, 1) == [event("r6", 1)]
    before = await listener_ids(admin, b)
    assert len(before) == 1
    assert await admin.client_kill_filter(_id=before[0]) == 1

    assert await sub.get(WAIT) is LAGGED  # once re-subscribed: the reader re-reads
    assert await quiet.get(WAIT) is LAGGED
    assert sub.get_nowait() is None
    after = await listener_ids(admin, b)
    assert len(after) == 1
    assert after != before
    assert await b.wait_subscribed(topic, WAIT)
    a.publish(topic, event("r6", 2))
    a.publish("session:s6", {"type": "session_updated"})
    assert await receive(sub, 1) == [event("r6", 2)]
    assert await receive(quiet, 1) == [{"type": "session_updated"}]
    assert sub.get_nowait() is None


async def test_start_fails_fast_when_nothing_listens(prefix: str) -> None:
    port = free_port()
    broker = RedisBroker(f"redis://127.0.0.1:{port}", prefix=prefix, connect_timeout=3)
    started = time.monotonic()
    with pytest.raises(RedisBrokerError, match=f"127.0.0.1:{port}"):
        await broker.start()
    assert time.monotonic() - started < WAIT
    local = broker.subscribe("run:x")
    broker.publish("run:x", event("x", 1))  # local delivery needs no Redis
    assert local.get_nowait() == event("x", 1)
    await broker.aclose()
    await broker.aclose()


class RedisServer:
    """A private ``redis-server`` on *port* that a test may stop and start again."""

    def __init__(self, port: int, directory: Path) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        async def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            client = Redis.from_url(self.url)
            try:
                return bool(await client.ping())
            except (RedisError, OSError):
                return False
            finally:
                await client.aclose()

        await eventually(up, f"redis-server on port {self.port}")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            await asyncio.to_thread(self.proc.wait, WAIT)
        self.proc = None


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (Debian's redis-server package)")
    server = RedisServer(free_port(), tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_publish_keeps_working_locally_while_redis_is_gone(
    private_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="heed.runs.redis_broker")
    broker = RedisBroker(private_redis.url, prefix=prefix, connect_timeout=2)
    other = RedisBroker(private_redis.url, prefix=prefix, connect_timeout=2)
    await broker.start()
    try:
        topic = "run:r7"
        sub = await subscribed(broker, topic)
        await private_redis.stop()

        # Redis is gone: publish neither raises nor blocks, and local readers still hear.
        errors: list[BaseException] = []

        def from_thread() -> None:
            try:
                broker.publish(topic, event("r7", 11))
            except BaseException as exc:
                errors.append(exc)

        started = time.monotonic()
        for seq in range(1, 11):
            broker.publish(topic, event("r7", seq))
        thread = threading.Thread(target=from_thread)
        thread.start()
        await asyncio.to_thread(thread.join, WAIT)
        assert errors == []
        assert time.monotonic() - started < 1.0
        got = await receive(sub, 11)
        assert seqs(got) == list(range(1, 12))
        assert sub.get_nowait() is None

        async def warned() -> bool:
            return any("dropped" in r.getMessage() for r in caplog.records)

        await eventually(warned, "a warning about dropped hints")

        # Redis comes back: the broker re-subscribes, its reader re-syncs once, and
        # messages cross both ways again.
        await private_redis.start()
        assert await sub.get(WAIT) is LAGGED
        assert await broker.wait_subscribed(topic, WAIT)
        await other.start()
        back = await subscribed(other, topic)
        other.publish(topic, event("r7", 12))
        assert await receive(sub, 1) == [event("r7", 12)]

        async def crossed() -> bool:
            # The publisher's pooled connection died with the server: the first hint
            # after the restart may be dropped (hints may be lost), a later one crosses.
            broker.publish(topic, event("r7", 13))
            message = await back.get(0.2)
            return message == event("r7", 13)

        await eventually(crossed, "a message from the restarted broker")
    finally:
        await broker.aclose()
        await other.aclose()


async def test_a_silent_connection_is_noticed_by_the_health_check(
    private_redis: RedisServer, prefix: str
) -> None:
    broker = RedisBroker(private_redis.url, prefix=prefix, connect_timeout=3, health_interval=0.2)
    admin = Redis.from_url(private_redis.url)
    await broker.start()
    try:
        sub = await subscribed(broker, "run:r10")
        before = await listener_ids(admin, broker)
        assert len(before) == 1
        # Redis stops answering (the TCP connection stays up): only the pings can tell.
        await admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        assert await sub.get(WAIT) is LAGGED
        after = await listener_ids(admin, broker)
        assert len(after) == 1
        assert after != before
    finally:
        await broker.aclose()
        await admin.aclose()
