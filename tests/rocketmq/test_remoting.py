"""The asyncio RocketMQ remoting client's message path against a real NameServer + broker
(5.3.3): sends, pulls and their filters, long polls, light queues, pipelining, timeouts and a
broker kill (its requests about topics, groups and offsets: test_remoting_metadata.py).

One local RocketMQ of the module's own serves it (the last test kills the broker); each test
uses its own topics. Measured figures are printed (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bridge.storage.rocketmq.mapping import NOTIFY_FILTER, PROP_NOTIFY_SKIP
from bridge.storage.rocketmq.remoting import (
    BrokerUnavailable,
    PullStatus,
    RemotingConnection,
    RemotingError,
    RemotingTimeout,
    RocketMQClient,
    SendStatus,
)
from bridge.storage.rocketmq.types import PullResult
from bridge.storage.rocketmq.wire import PullSysFlag, RequestCode, ResponseCode
from tests.support.rocketmq import LocalRocketMQ

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]

T = TypeVar("T")
_ids = itertools.count()


@pytest.fixture(scope="module")
def rmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    """One local NameServer + broker for the module."""
    server = LocalRocketMQ(Path(tmp_path_factory.mktemp("rocketmq")), timer=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _name(prefix: str) -> str:
    return f"{prefix}_{next(_ids)}_{uuid.uuid4().hex[:6]}"


def run(rmq: LocalRocketMQ, scenario: Callable[[RocketMQClient], Awaitable[T]], **kw: Any) -> T:
    """Run `scenario(client)` with a fresh client on a fresh event loop."""

    async def main() -> T:
        async with RocketMQClient(
            rmq.namesrv_addr,
            client_id=_name("test"),
            producer_group="test_producers",
            consumer_group="test_consumers",
            **kw,
        ) as client:
            return await scenario(client)

    return asyncio.run(main())


async def _topic(client: RocketMQClient, queues: int = 4) -> str:
    topic = _name("T")
    await client.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
    await _await_route(client, topic)
    return topic


async def _await_route(client: RocketMQClient, topic: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            await client.fetch_route(topic)
            return
        except RemotingError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _await_max_offset(
    client: RocketMQClient, topic: str, queue_id: int, expected: int, within: float = 5.0
) -> None:
    """Wait until the queue's max offset reaches `expected`.

    A send is acknowledged once the commit log has the message; the consume queue (what pull and
    max offset read) is built from it asynchronously a few milliseconds later.
    """
    deadline = time.monotonic() + within
    while await client.max_offset(topic, queue_id) < expected:
        assert time.monotonic() < deadline, "consume queue did not catch up"
        await asyncio.sleep(0.01)


def test_send_and_pull_back_100(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client)
        sent = []
        latencies = []
        for i in range(100):
            start = time.perf_counter()
            result = await client.send(
                topic,
                f"body-{i}".encode() + bytes(range(256)),
                tags="abc"[i % 3],
                keys=[f"key{i}", f"alt{i}"],
                properties={"seq": str(i), "ünï": "cödé"},
                queue_id=1,
            )
            latencies.append(time.perf_counter() - start)
            assert result.status is SendStatus.SEND_OK
            assert (result.queue_id, result.queue_offset) == (1, i)
            sent.append(result)
        latencies.sort()
        print(
            f"\nsend latency over 100 sends: median {latencies[50] * 1000:.2f} ms, "
            f"p99 {latencies[98] * 1000:.2f} ms"
        )
        await _await_max_offset(client, topic, 1, 100)
        assert await client.max_offset(topic, 1) == 100
        assert await client.min_offset(topic, 1) == 0
        assert await client.max_offset(topic, 0) == 0

        got = []
        offset = 0
        start = time.perf_counter()
        while offset < 100:
            pulled = await client.pull(topic, 1, offset, 32)
            assert pulled.status is PullStatus.FOUND
            assert pulled.max_offset == 100
            got.extend(pulled.messages)
            offset = pulled.next_offset
        elapsed = time.perf_counter() - start
        print(f"pulled 100 messages in {elapsed * 1000:.1f} ms ({100 / elapsed:.0f} msg/s)")
        assert len(got) == 100
        last_commit = -1
        for i, (msg, result) in enumerate(zip(got, sent, strict=True)):
            assert msg.topic == topic
            assert msg.body == f"body-{i}".encode() + bytes(range(256))
            assert msg.tags == "abc"[i % 3]
            assert msg.keys == [f"key{i}", f"alt{i}"]
            assert msg.properties["seq"] == str(i)
            assert msg.properties["ünï"] == "cödé"
            assert msg.queue_id == 1
            assert msg.queue_offset == i
            assert msg.msg_id == result.msg_id
            assert msg.offset_msg_id == result.offset_msg_id
            assert msg.commit_log_offset > last_commit
            last_commit = msg.commit_log_offset
            assert msg.born_timestamp <= msg.store_timestamp + 1000
            assert abs(msg.store_timestamp / 1000 - time.time()) < 120
            assert msg.store_host == rmq.broker_addr

        # Past the end: nothing new; far past it: offset illegal.
        end = await client.pull(topic, 1, 100, 32)
        assert end.status is PullStatus.NO_NEW_MSG
        assert end.next_offset == 100
        beyond = await client.pull(topic, 1, 1000, 32)
        assert beyond.status is PullStatus.OFFSET_ILLEGAL
        assert beyond.next_offset == 100

        # Throughput with a larger batch.
        start = time.perf_counter()
        total = 0
        for _ in range(20):
            offset = 0
            while offset < 100:
                pulled = await client.pull(topic, 1, offset, 100)
                total += len(pulled.messages)
                offset = pulled.next_offset
        elapsed = time.perf_counter() - start
        print(f"pull throughput: {total / elapsed:.0f} msg/s ({total} messages of ~300 bytes)")

    run(rmq, scenario)


def test_tag_filter(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        for i in range(30):
            await client.send(topic, str(i).encode(), tags="abcd"[i % 4], queue_id=0)
        await _await_max_offset(client, topic, 0, 30)
        bodies: list[int] = []
        offset = 0
        for _ in range(50):
            pulled = await client.pull(topic, 0, offset, 8, subscription="a || b")
            if pulled.status is PullStatus.NO_NEW_MSG:
                break
            assert pulled.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG)
            assert all(m.tags in ("a", "b") for m in pulled.messages)
            bodies.extend(int(m.body) for m in pulled.messages)
            offset = pulled.next_offset
        assert offset == 30
        assert bodies == [i for i in range(30) if i % 4 in (0, 1)]

    run(rmq, scenario)


def test_notifys_filtered_pull_returns_only_unmarked_messages_and_skips_past_the_rest(
    rmq: LocalRocketMQ,
) -> None:
    """notify's filter on the real broker: messages a bridge marked stay on the broker; backends'
    (unmarked) come back, in order, and the pull moves past the kept-back ones."""

    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        marks = ["n1", None, "n2", "n1", None, "n3", "n1"]
        for i, mark in enumerate(marks):
            props = {PROP_NOTIFY_SKIP: mark} if mark else None
            await client.send(topic, str(i).encode(), tags="t", properties=props, queue_id=0)
        await _await_max_offset(client, topic, 0, len(marks))
        bodies: list[int] = []
        offset = 0
        for _ in range(20):
            pulled = await client.pull(
                topic, 0, offset, 2, subscription=NOTIFY_FILTER, expression_type="SQL92"
            )
            if pulled.status is PullStatus.NO_NEW_MSG:
                break
            assert pulled.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG)
            bodies.extend(int(m.body) for m in pulled.messages)
            offset = pulled.next_offset
        assert bodies == [1, 4]
        assert offset == len(marks)  # the kept-back tail was skipped, not left to re-read

        # A held filtered pull never brings a message the filter keeps back, only a match. (The
        # broker also re-checks held pulls every few seconds and may answer one with nothing
        # when the queue grew: the client then pulls again from where that answer says.)
        def held_pull(start: int) -> asyncio.Task[PullResult]:
            return asyncio.create_task(
                client.pull(
                    topic,
                    0,
                    start,
                    8,
                    subscription=NOTIFY_FILTER,
                    expression_type="SQL92",
                    suspend_timeout_ms=10_000,
                )
            )

        poll = held_pull(offset)
        await asyncio.sleep(0.3)
        await client.send(topic, b"7", tags="t", properties={PROP_NOTIFY_SKIP: "n1"}, queue_id=0)
        await asyncio.sleep(0.5)
        await client.send(topic, b"8", tags="t", queue_id=0)
        answers: list[list[bytes]] = []
        deadline = time.monotonic() + 20
        while not any(answers) and time.monotonic() < deadline:
            pulled = await asyncio.wait_for(poll, 15)
            answers.append([m.body for m in pulled.messages])
            poll = held_pull(pulled.next_offset)
        poll.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poll
        assert [body for answer in answers for body in answer] == [b"8"], answers

    run(rmq, scenario)


def test_long_poll_wakes_on_arrival(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        await client.send(topic, b"first", queue_id=0)
        await _await_max_offset(client, topic, 0, 1)
        wakes = []
        for round_ in range(5):
            offset = round_ + 1
            poll = asyncio.create_task(client.pull(topic, 0, offset, 32, suspend_timeout_ms=10_000))
            await asyncio.sleep(0.3)  # the broker now holds the request
            assert not poll.done()
            sent_at = time.perf_counter()
            await client.send(topic, f"r{round_}".encode(), queue_id=0)
            acked_at = time.perf_counter()
            pulled = await poll
            woke_at = time.perf_counter()
            assert pulled.status is PullStatus.FOUND
            assert [m.body for m in pulled.messages] == [f"r{round_}".encode()]
            wakes.append((woke_at - sent_at, woke_at - acked_at))
        print(
            "\nlong poll wake-up after send start / after send ack (ms): "
            + ", ".join(f"{a * 1000:.1f}/{b * 1000:.1f}" for a, b in wakes)
        )
        # No timing assertion (shared, noisy machines): that the held pull returned the new
        # message at all, before its 10 s suspension ran out, is the behaviour under test.

        # With nothing arriving, the broker answers NO_NEW_MSG after the suspend time.
        offset = 6
        start = time.perf_counter()
        idle = await client.pull(topic, 0, offset, 32, suspend_timeout_ms=1000)
        assert idle.status is PullStatus.NO_NEW_MSG
        assert time.perf_counter() - start > 0.8  # it was held, not answered at once

    run(rmq, scenario)


def test_timeout_surfaces_as_remoting_timeout(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        conn = await RemotingConnection.open(rmq.broker_addr)
        try:
            fields = {
                "consumerGroup": "test_consumers",
                "topic": topic,
                "queueId": "0",
                "queueOffset": "0",
                "maxMsgNums": "1",
                "sysFlag": str(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND),
                "commitOffset": "0",
                "suspendTimeoutMillis": "5000",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            }
            start = time.perf_counter()
            with pytest.raises(RemotingTimeout):
                await conn.request(RequestCode.PULL_MESSAGE, fields, timeout=0.3)
            assert time.perf_counter() - start < 4.5  # the 0.3 s timeout, not the 5 s hold
            assert conn.pending == 0
            # The connection is still usable; the late response is dropped.
            response = await conn.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}, timeout=3
            )
            assert response.code == ResponseCode.SUCCESS
        finally:
            await conn.close()

    run(rmq, scenario)


def test_lmq_multi_dispatch(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        lmq_a, lmq_b = f"%LMQ%{_name('a')}%sub", f"%LMQ%{_name('b')}"
        group = f"%LMQ%{_name('g')}"
        results = []
        for i in range(3):
            targets = [lmq_a, lmq_b] if i != 1 else [lmq_b]
            results.append(
                await client.send(
                    topic,
                    f"m{i}".encode(),
                    tags="t",
                    properties={"INNER_MULTI_DISPATCH": ",".join(targets)},
                    queue_id=0,
                )
            )
        # The send reports the offset in the parent topic's queue only.
        assert [r.queue_offset for r in results] == [0, 1, 2]

        await _await_max_offset(client, lmq_b, 0, 3)
        a = await client.pull(lmq_a, 0, 0, 32, consumer_group=group)
        b = await client.pull(lmq_b, 0, 0, 32, consumer_group=group)
        assert [m.body for m in a.messages] == [b"m0", b"m2"]
        assert [m.body for m in b.messages] == [b"m0", b"m1", b"m2"]
        assert (a.next_offset, b.next_offset) == (2, 3)
        # Stored messages keep the parent topic, queue id and queue offset; the LMQ offsets are
        # in INNER_MULTI_QUEUE_OFFSET, in the order of INNER_MULTI_DISPATCH.
        assert {m.topic for m in a.messages + b.messages} == {topic}
        assert [m.lmq_offsets() for m in b.messages] == [
            {lmq_a: 0, lmq_b: 0},
            {lmq_b: 1},
            {lmq_a: 1, lmq_b: 2},
        ]
        assert await client.max_offset(lmq_a, 0) == 2
        assert await client.max_offset(lmq_b, 0) == 3

        await client.update_consumer_offset(lmq_b, 0, 2, consumer_group=group)
        assert await client.query_consumer_offset(lmq_b, 0, consumer_group=group) == 2

        # Long polling works on an LMQ too.
        poll = asyncio.create_task(
            client.pull(lmq_a, 0, 2, 32, consumer_group=group, suspend_timeout_ms=10_000)
        )
        await asyncio.sleep(0.3)
        assert not poll.done()
        await client.send(topic, b"m3", properties={"INNER_MULTI_DISPATCH": lmq_a}, queue_id=0)
        acked = time.perf_counter()
        woke = await poll
        print(f"\nLMQ long poll woke {(time.perf_counter() - acked) * 1000:.1f} ms after the ack")
        assert [m.body for m in woke.messages] == [b"m3"]

    run(rmq, scenario)


def test_pipelined_sends_on_one_connection_are_stored_in_submission_order(
    rmq: LocalRocketMQ,
) -> None:
    """deploy/rocketmq/broker.conf runs one send thread, so pipelined sends keep their order."""

    async def scenario(client: RocketMQClient) -> None:
        response = await client.call(rmq.broker_addr, RequestCode.GET_BROKER_CONFIG)
        assert response.code == ResponseCode.SUCCESS
        config = dict(
            line.split("=", 1) for line in response.body.decode().splitlines() if "=" in line
        )
        assert config["sendMessageThreadPoolNums"] == "1"

        topic = await _topic(client, queues=1)
        conn = await client.connection(rmq.broker_addr)
        count = 200
        start = time.perf_counter()
        sends = [
            asyncio.create_task(client.send(topic, f"{i:04d}".encode() * 64, queue_id=0))
            for i in range(count)
        ]
        await asyncio.sleep(0)
        # Every request is written before any response is read: they are all in flight at once.
        assert conn.pending >= count
        results = await asyncio.gather(*sends)
        elapsed = time.perf_counter() - start
        print(f"\n{count} pipelined sends in {elapsed * 1000:.0f} ms")
        assert [r.queue_offset for r in results] == list(range(count))

        await _await_max_offset(client, topic, 0, count)
        bodies: list[bytes] = []
        while len(bodies) < count:
            pulled = await client.pull(topic, 0, len(bodies), 64)
            assert pulled.status is PullStatus.FOUND
            bodies.extend(m.body for m in pulled.messages)
        assert bodies == [f"{i:04d}".encode() * 64 for i in range(count)]

    run(rmq, scenario)


def test_broker_kill_fails_fast_and_client_reconnects(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        await client.send(topic, b"before", queue_id=0)
        # The ack can come before the broker has indexed the message; a pull beyond the indexed
        # end is answered at once (offset moved) instead of being held, so wait for the index.
        await _await_max_offset(client, topic, 0, 1)
        poll = asyncio.create_task(client.pull(topic, 0, 1, 32, suspend_timeout_ms=20_000))
        await asyncio.sleep(0.3)
        killed = time.perf_counter()
        await asyncio.to_thread(rmq.kill_broker)
        with pytest.raises(BrokerUnavailable):
            await poll
        failed_after = time.perf_counter() - killed
        print(f"\npending long poll failed {failed_after * 1000:.0f} ms after the kill began")
        assert failed_after < 15.0  # fails when the process dies, not at the 20 s suspension

        start = time.perf_counter()
        with pytest.raises(BrokerUnavailable):
            await client.send(topic, b"during", queue_id=0)
        assert time.perf_counter() - start < client.retry_deadline + 5

        await asyncio.to_thread(rmq.start_broker)
        # The NameServer dropped the broker's routes when it died; wait for re-registration.
        await _await_route(client, topic, within=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                result = await client.send(topic, b"after", queue_id=0)
                break
            except (BrokerUnavailable, RemotingError, RemotingTimeout):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert result.status is SendStatus.SEND_OK
        await _await_max_offset(client, topic, 0, 2)
        pulled = await client.pull(topic, 0, 0, 32)
        assert [m.body for m in pulled.messages] == [b"before", b"after"]

    run(rmq, scenario, retry_deadline=3.0)
