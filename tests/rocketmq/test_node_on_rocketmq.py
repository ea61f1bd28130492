"""The broker node on the RocketMQ store, in-process: notify wakes pull tasks for messages other
writers stored, and QoS 2 ids whose store was never confirmed are settled by the broker's key
index (stored once, never twice). The session's real RocketMQ serves every test; each test has
its own namespace and first-level topic; notify reads every topic of the broker and one test
switches a broker setting, so under pytest-xdist, where the workers share the session's broker,
the module has a broker of its own."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from bridge.config import Config
from bridge.mqtt import codec
from bridge.mqtt.packets import Publish, Pubrec, Subscribe, Subscription
from bridge.node import Node, Unsettled
from bridge.storage.base import Message
from bridge.storage.rocketmq.store import RocketMQStore
from notify.core import Notifier
from notify.embedded import embedded_notifier
from tests.integration.test_store_failure import open_connection
from tests.support.clients import paho_client
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ
from tests.support.rocketmq_use import admin_send, rocketmq_of_its_own_when_shared

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

_ids = itertools.count()


@pytest.fixture(scope="module")
def rocketmq(
    rocketmq: LocalRocketMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRocketMQ | ExternalRocketMQ]:
    """The broker this module's tests use (see the module's docstring)."""
    with rocketmq_of_its_own_when_shared(
        rocketmq, tmp_path_factory.mktemp("rocketmq-notify")
    ) as mq:
        yield mq


def _unique(prefix: str) -> str:
    return f"{prefix}{next(_ids)}x{uuid.uuid4().hex[:8]}"


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _run_node(
    rocketmq: LocalRocketMQ,
    tmp_path: Path,
    scenario: Callable[[Node, RocketMQStore, str], Awaitable[None]],
    *,
    held_reads: int = 1000,
) -> None:
    namespace = _unique("n")

    async def main() -> None:
        store = RocketMQStore(
            rocketmq.namesrv_addr,
            tmp_path / "node",
            namespace=namespace,
            send_timeout=2.0,
            held_reads=held_reads,
        )
        node = Node(Config(listen=["127.0.0.1:0"], data_dir=str(tmp_path)), store)
        await node.start()
        try:
            await scenario(node, store, namespace)
        finally:
            await node.stop()

    uvloop.run(main())


def _publishes(transport: Any) -> list[Publish]:
    return [p for p in transport.packets() if isinstance(p, Publish)]


async def _dispatch_copies(
    rocketmq: LocalRocketMQ, tmp_path: Path, namespace: str, topic: str, count: int
) -> None:
    """Write `count` messages into the light queue of `topic/#` the way a notifier dispatches a
    backend's messages: unmarked copies that no bridge announces, so only notify can wake their
    readers."""
    other = RocketMQStore(rocketmq.namesrv_addr, tmp_path / "other", namespace=namespace)
    await other.open()
    try:
        lmq = other.register_lmq(f"f:{topic}/#")
        for i in range(count):
            await other.dispatch(
                Message(f"{topic}/m", f"m{i}".encode(), qos=1, key=f"o{i}"), [lmq], f"origin{i}"
            )
    finally:
        await other.close()


@contextlib.asynccontextmanager
async def _notifier(node: Node, store: RocketMQStore) -> AsyncIterator[Notifier]:
    """The node's embedded notifier, started and ready (every queue has a reader), then stopped."""
    notifier = embedded_notifier(node, store)
    await notifier.start()
    try:
        await asyncio.wait_for(notifier.ready.wait(), 20)
        yield notifier
    finally:
        await notifier.stop()


async def _reader_and_writer(node: Node, topic: str, count: int) -> tuple[Any, Any]:
    """A subscriber of `topic/#` (its recording transport) and a publisher on the node that has
    sent `count` QoS 1 messages to `topic/own` (its connection)."""
    sub, transport = await open_connection(node, "reader")
    sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 1)])))
    pub, _ = await open_connection(node, "writer")
    await asyncio.sleep(0.2)
    for i in range(count):
        packet = Publish(f"{topic}/own", b"own%d" % i, 1, False, False, i + 1)
        pub.data_received(codec.encode(packet))
    return transport, pub


def test_notify_wakes_a_subscriber_for_messages_no_bridge_announced(
    rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    topic = _unique("plant")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        async with _notifier(node, store) as notifier:
            sub, transport = await open_connection(node, "reader")
            sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 1)])))
            await asyncio.sleep(0.2)
            await _dispatch_copies(rocketmq, tmp_path, namespace, topic, 5)
            await _until(lambda: len(_publishes(transport)) == 5, 20)
            assert [p.payload for p in _publishes(transport)] == [
                f"m{i}".encode() for i in range(5)
            ]
            assert notifier.stats.events >= 1

    # Parts beyond `rocketmq_held_reads` (here all) learn of such messages from notify alone.
    _run_node(rocketmq, tmp_path, scenario, held_reads=0)


def test_notify_reads_no_message_a_bridge_stored_only_the_unannounced_ones(
    rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    """Bridges wake the readers of what they store themselves, so notify pulls with a filter
    that leaves every bridge's messages on the broker (this node's, another node's, queue-less
    ones): it reads only what no bridge announced, and still wakes subscribers for that."""
    topic = _unique("line")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        async with _notifier(node, store) as notifier:
            transport, pub = await _reader_and_writer(node, topic, 20)
            nobody = Publish(f"{_unique('nobody')}/x", b"q", 1, False, False, 99)
            pub.data_received(codec.encode(nobody))
            await _until(lambda: len(_publishes(transport)) == 20, 20)
            # Another bridge's store (its node would wake its peers' readers itself).
            other = RocketMQStore(
                rocketmq.namesrv_addr, tmp_path / "peer", namespace=namespace, node_id="peer"
            )
            await other.open()
            try:
                await other.append(Message(f"{topic}/p", b"p", qos=1, key="p0"), [f"f:{topic}/#"])
            finally:
                await other.close()
            await asyncio.sleep(1.0)  # time for notify to have read them, had they come
            assert notifier.stats.messages == 0
            assert not notifier.stats.unfiltered

            await _dispatch_copies(rocketmq, tmp_path, namespace, topic, 5)
            # The peer's message was never announced here; the copies' wake reads it too.
            await _until(lambda: len(_publishes(transport)) == 26, 20)
            assert [p.payload for p in _publishes(transport)][20:] == [b"p"] + [
                f"m{i}".encode() for i in range(5)
            ]
            # The reader may have been woken first by the node's own refresh of queue ends
            # (every few seconds): notify's count of what it read can come a moment later.
            await _until(lambda: notifier.stats.messages >= 5, 20)
            await asyncio.sleep(0.5)
            assert notifier.stats.messages == 5

    _run_node(rocketmq, tmp_path, scenario)


def _property_filters(rocketmq: LocalRocketMQ, *, enabled: bool) -> None:
    """Switch the running broker's `enablePropertyFilter` (it takes effect at once)."""
    value = "true" if enabled else "false"
    rocketmq.admin(
        "updateBrokerConfig", "-b", rocketmq.broker_addr, "-k", "enablePropertyFilter", "-v", value
    )


def test_notify_reads_everything_and_says_so_when_the_broker_refuses_property_filters(
    rocketmq: LocalRocketMQ, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker without enablePropertyFilter: notify still wakes the subscriber for messages no
    bridge announced, reading every message as before, and logs why once."""
    topic = _unique("kiln")
    _property_filters(rocketmq, enabled=False)

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        async with _notifier(node, store) as notifier:
            transport, _ = await _reader_and_writer(node, topic, 3)
            await _dispatch_copies(rocketmq, tmp_path, namespace, topic, 1)
            await _until(lambda: len(_publishes(transport)) == 4, 20)
            await _until(lambda: notifier.stats.messages >= 4, 20)
            assert notifier.stats.unfiltered

    try:
        with caplog.at_level("WARNING", logger="notify"):
            _run_node(rocketmq, tmp_path, scenario)
    finally:
        _property_filters(rocketmq, enabled=True)
    refused = [r for r in caplog.records if "refused a property filter" in r.getMessage()]
    assert len(refused) == 1


async def _resent_after_an_unanswered_send(
    node: Node, store: RocketMQStore, monkeypatch: pytest.MonkeyPatch, topic: str, payload: bytes
) -> Any:
    """A QoS 2 subscriber of `topic/#`; a publisher's PUBLISH of `payload` to `topic/x` that the
    broker stores but whose answer is lost (the send times out, the connection closes, no
    PUBREC); then its resend (DUP), PUBRECed. Returns the subscriber's recording transport."""
    sub, sub_transport = await open_connection(node, "subscriber")
    sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 2)])))
    await asyncio.sleep(0.2)
    pub, transport = await open_connection(node, "publisher")
    real = store._pipeline._answered
    monkeypatch.setattr(store._pipeline, "_answered", lambda send, response, error: None)
    pub.data_received(codec.encode(Publish(f"{topic}/x", payload, 2, packet_id=5)))
    await _until(lambda: transport.closed, 10)
    assert not any(isinstance(p, Pubrec) for p in transport.packets())
    pub.connection_lost(None)
    monkeypatch.setattr(store._pipeline, "_answered", real)

    pub, transport = await open_connection(node, "publisher")
    pub.data_received(codec.encode(Publish(f"{topic}/x", payload, 2, dup=True, packet_id=5)))
    await _until(lambda: any(isinstance(p, Pubrec) for p in transport.packets()), 10)
    return sub_transport


def test_qos2_resend_after_an_unanswered_send_is_not_stored_twice(
    rocketmq: LocalRocketMQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _unique("q2")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        await _resent_after_an_unanswered_send(node, store, monkeypatch, topic, b"once")
        (part,) = store.parts(f"f:{topic}/#")  # one broker group: one part
        assert await store.track_queue(part) == 1  # stored once, not twice

    _run_node(rocketmq, tmp_path, scenario)


def test_a_qos2_message_found_stored_after_an_unanswered_send_reaches_its_subscriber_once(
    rocketmq: LocalRocketMQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when a master dies after storing a message and before its answer left: the store
    never counted it in its queue's end, and the resend's lookup finds it (on the slave). Its
    subscriber must still be sent it, once, with no later message to push it along."""
    topic = _unique("q2f")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        sub_transport = await _resent_after_an_unanswered_send(
            node, store, monkeypatch, topic, b"found"
        )
        await _until(lambda: _publishes(sub_transport) != [], 10)
        await asyncio.sleep(0.5)
        assert [p.payload for p in _publishes(sub_transport)] == [b"found"]

    _run_node(rocketmq, tmp_path, scenario)


def test_qos2_resend_whose_first_send_never_arrived_is_stored(
    rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    topic = _unique("q2n")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        sub, _ = await open_connection(node, "subscriber")
        sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 2)])))
        await asyncio.sleep(0.2)
        pub, transport = await open_connection(node, "publisher")
        # As after a crash between writing the marker and sending: marker, no message.
        session = node.sessions["publisher"]
        key = f"never-sent-{uuid.uuid4().hex}"
        session.hold_qos2_in(9, Unsettled(f"{topic}/x", key))
        pub.data_received(codec.encode(Publish(f"{topic}/x", b"late", 2, dup=True, packet_id=9)))
        await _until(lambda: any(isinstance(p, Pubrec) for p in transport.packets()), 10)
        (part,) = store.parts(f"f:{topic}/#")
        assert await store.track_queue(part) == 1
        result = await store.read(part, 0, 10)
        assert [s.message.payload for s in result.messages] == [b"late"]
        # Under the key it may have been stored with before: a reader that had such a copy
        # leaves this one out (Session.first_copy).
        assert result.messages[0].message.key == key

    _run_node(rocketmq, tmp_path, scenario)


def test_a_qos2_resend_stored_again_after_a_lookup_that_missed_is_not_sent_twice(
    rocketmq: LocalRocketMQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when a master dies after serving a QoS 2 message and before its slave had it: the
    subscriber has the first copy, the resend's lookup (on the slave) misses it, and the
    message is stored again. The subscriber is sent it once."""
    topic = _unique("q2c")

    async def lookup_misses(self: RocketMQStore, topic: str, key: str) -> bool:
        return False

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        sub, sub_transport = await open_connection(node, "subscriber")
        sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 2)])))
        await asyncio.sleep(0.2)
        pub, transport = await open_connection(node, "publisher")
        pub.data_received(codec.encode(Publish(f"{topic}/x", b"pay 1", 2, packet_id=9)))
        await _until(lambda: [p.payload for p in _publishes(sub_transport)] == [b"pay 1"], 10)
        # The send turns out unsettled, and the lookup of its key misses.
        (first,) = (await store.read(store.parts(f"f:{topic}/#")[0], 0, 10)).messages
        session = node.sessions["publisher"]
        session.hold_qos2_in(9, Unsettled(f"{topic}/x", first.message.key))
        monkeypatch.setattr(RocketMQStore, "find_key", lookup_misses)
        pub.data_received(codec.encode(Publish(f"{topic}/x", b"pay 1", 2, dup=True, packet_id=9)))
        await _until(lambda: sum(isinstance(p, Pubrec) for p in transport.packets()) == 2, 10)
        (part,) = store.parts(f"f:{topic}/#")
        await _until(lambda: store.end_offset(part) == 2, 10)  # stored twice, one key
        second = (await store.read(part, 1, 10)).messages[0]
        assert second.message.key == first.message.key and second.seq != first.seq
        await _until(lambda: node.metrics.get("qos2_copies_skipped") == 1, 10)
        await asyncio.sleep(0.3)
        assert [p.payload for p in _publishes(sub_transport)] == [b"pay 1"]

    _run_node(rocketmq, tmp_path, scenario)


def test_message_a_backend_produces_into_rocketmq_reaches_mqtt_subscribers(
    rocketmq: LocalRocketMQ, bridge_factory: Callable[..., Any]
) -> None:
    """The issue's example: topic `pay`, tag `pay/store/42/order/9`, produced by RocketMQ's own
    admin tool (a client we did not write), reaches the subscriber of `pay/store/42/#`."""
    first = _unique("pay")
    node = bridge_factory(
        "store=rocketmq",
        f"rocketmq_namesrv={rocketmq.namesrv_addr}",
        f"rocketmq_namespace={_unique('b')}",
    )
    with paho_client(node.port, "device-42") as client:
        client.client.subscribe(f"{first}/store/42/#", qos=1)
        time.sleep(0.5)
        got: list[Any] = []

        def holding(count: int) -> Callable[[float], bool]:
            """`admin_send`'s check that the device has received `count` messages."""

            def arrived(timeout: float) -> bool:
                got.extend(client.drain(count - len(got), timeout=timeout))
                return len(got) >= count

            return arrived

        admin_send(rocketmq, "-t", first, "-c", f"{first}/store/42/order/9", "-p", "paid 9",
                   arrived=holding(1))  # fmt: skip
        # To nobody: stored twice, it would change nothing.
        admin_send(rocketmq, "-t", first, "-c", f"{first}/store/7/order/1", "-p", "other store")
        admin_send(rocketmq, "-t", first, "-c", f"{first}/store/42/order/10", "-p", "paid 10",
                   arrived=holding(2))  # fmt: skip
        got += client.drain(2 - len(got), timeout=30)
        assert [(m.topic, m.payload, m.qos) for m in got] == [
            (f"{first}/store/42/order/9", b"paid 9", 1),
            (f"{first}/store/42/order/10", b"paid 10", 1),
        ]
        assert client.drain(1, timeout=1.0) == []  # store 7's order went to nobody
