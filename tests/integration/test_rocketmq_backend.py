"""The bridge with `store=rocketmq` against a real NameServer + broker (5.3.3), with real MQTT
clients (paho-mqtt; a raw client where the test must act as a client that vanishes mid-way).

What is stored is read back with an independent consumer, the official admin tool (mqadmin
`consumeMessage`, `queryMsgByKey`), and checked against the mapping of docs/design.md ("MQTT on
RocketMQ: the mapping"). Every test has its own light-queue namespace and its own first MQTT
level (so its own RocketMQ topic) on the session's shared broker.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import paho.mqtt.client as paho
import pytest

from bridge.mqtt.packets import Puback, Publish
from tests.support.clients import PahoClient, RawClient, paho_client
from tests.support.mqtt5 import paho5, sub_options
from tests.support.processes import BridgeProcess
from tests.support.qos import ExactlyOnceReceiver
from tests.support.rocketmq_use import rocketmq_nodes
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]

# Generous: two cores shared with other jobs, and every admin-tool call starts a JVM.
DELIVERY_TIMEOUT = 60.0
QUIET = 1.5
"""How long nothing more may arrive after the expected messages (duplicates, extra matches)."""


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@pytest.fixture
def start_bridge(
    bridge_factory: Callable[..., BridgeProcess], rocketmq
) -> Callable[..., BridgeProcess]:
    """Start a store=rocketmq node with a light-queue namespace of its own test."""
    namespace = unique("ns")
    start = rocketmq_nodes(bridge_factory, rocketmq, f"rocketmq_namespace={namespace}")
    start.namespace = namespace  # type: ignore[attr-defined]
    return start


# --- MQTT helpers --------------------------------------------------------------------------------


def subscribe(client: PahoClient, *filters: tuple[str, int], timeout: float = 30.0) -> list[int]:
    """SUBSCRIBE and wait for the SUBACK; the granted QoS (or 128) of each filter."""
    done = threading.Event()
    codes: list[int] = []

    def on_subscribe(_c, _u, _mid, reason_codes, _p) -> None:  # type: ignore[no-untyped-def]
        codes.extend(int(rc.value) for rc in reason_codes)
        done.set()

    client.client.on_subscribe = on_subscribe
    result, _mid = client.client.subscribe(list(filters))
    assert result == paho.MQTT_ERR_SUCCESS
    assert done.wait(timeout), f"no SUBACK for {filters} within {timeout} s"
    return codes


def publish_all(
    client: PahoClient, messages: list[tuple[str, bytes, int]], retain: bool = False
) -> None:
    """Publish (topic, payload, qos) messages and wait until each is acknowledged (QoS 1/2) or
    written to the socket (QoS 0)."""
    infos = [client.client.publish(t, p, q, retain) for t, p, q in messages]
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    for info, (topic, payload, qos) in zip(infos, messages, strict=True):
        info.wait_for_publish(max(deadline - time.monotonic(), 0.1))
        assert info.is_published(), f"{topic} {payload!r} (QoS {qos}) was not acknowledged"


def receive(client: PahoClient, count: int, timeout: float = DELIVERY_TIMEOUT) -> list:
    """Exactly the next `count` messages (fails naming what did arrive), then checks that
    nothing more comes for QUIET seconds (no duplicate, no message that should not match)."""
    got = client.drain(count, timeout)
    assert len(got) == count, (
        f"{len(got)} of {count} messages arrived: {[(m.topic, m.payload) for m in got]}"
    )
    assert_quiet(client)
    return got


def assert_quiet(client: PahoClient, window: float = QUIET) -> None:
    extra = client.drain(1, window)
    assert not extra, f"unexpected extra message {extra[0].topic} {extra[0].payload!r}"


# --- reading RocketMQ with the admin tool ---------------------------------------------------------


@dataclass
class RocketMQMessage:
    """One message as mqadmin `consumeMessage` prints it."""

    topic: str
    properties: dict[str, str]
    body: bytes

    @property
    def tag(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")


_MESSAGE = re.compile(
    r"^MSGID: .*?Message\{topic='(?P<topic>[^']*)'.*?properties=\{(?P<props>.*?)\}, "
    r"body=\[(?P<body>[-0-9, ]*)\]",
    re.MULTILINE,
)
_PROPERTY_SPLIT = re.compile(r", (?=[A-Za-z_%][A-Za-z0-9_.%]*=)")


def _parse_properties(text: str) -> dict[str, str]:
    """Java's Map.toString, `{a=1, b=2}` without the braces (our values hold no `, x=`)."""
    properties = {}
    for item in _PROPERTY_SPLIT.split(text):
        name, _, value = item.partition("=")
        properties[name] = value
    return properties


def consume_topic(rocketmq, topic: str) -> list[RocketMQMessage]:
    """Every message of a RocketMQ topic, all queues from their first offset (mqadmin
    consumeMessage: a pull consumer that commits nothing). [] while the topic does not exist."""
    try:
        out = rocketmq.admin("consumeMessage", "-t", topic)
    except RuntimeError as exc:
        if "No topic route info" in str(exc) or "Can not find Message Queue" in str(exc):
            return []
        raise
    return [
        RocketMQMessage(
            topic=m["topic"],
            properties=_parse_properties(m["props"]),
            body=bytes(int(b) & 0xFF for b in m["body"].split(", ") if b),
        )
        for m in _MESSAGE.finditer(out)
    ]


def poll_topic(
    rocketmq, topic: str, count: int, timeout: float = 120.0
) -> dict[str, RocketMQMessage]:
    """Consume the topic until it holds `count` messages (QoS 0 is written unawaited); by tag."""
    deadline = time.monotonic() + timeout
    while True:
        messages = consume_topic(rocketmq, topic)
        if len(messages) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(messages) == count, f"RocketMQ topic {topic} holds {messages}, expected {count}"
    by_tag = {m.tag: m for m in messages}
    assert len(by_tag) == count, f"two messages with one tag in {messages}"
    return by_tag


def query_by_key(rocketmq, topic: str, key: str, timeout: float = 60.0) -> list[str]:
    """Message ids (UNIQ_KEY) the broker's key index returns for `key` (the index is built
    asynchronously: polled until it answers)."""
    deadline = time.monotonic() + timeout
    while True:
        out = rocketmq.admin("queryMsgByKey", "-t", topic, "-k", key)
        ids = [line.split()[0] for line in out.splitlines() if re.match(r"^[0-9A-F]{32}\s", line)]
        if ids or time.monotonic() > deadline:
            return ids
        time.sleep(0.5)


# --- 1. the mapping -------------------------------------------------------------------------------


def test_qos0_1_2_publishes_are_stored_in_rocketmq_as_the_mapping_says(start_bridge, rocketmq):
    node_id = unique("node-")
    bridge = start_bridge(f"node_id={node_id}")
    first = unique("map")
    publisher_id = unique("pub-")
    before_ms = int(time.time() * 1000)
    with paho_client(bridge.port) as sub, paho_client(bridge.port, publisher_id) as pub:
        # A subscriber, so QoS 1/2 messages are dispatched to its filter's light queue.
        assert subscribe(sub, (f"{first}/#", 2)) == [2]
        publish_all(
            pub,
            [
                (f"{first}/line1/q0", b"zero \x00\xff", 0),
                (f"{first}/line1/q2", "two \u00e9".encode(), 2),
            ],
        )
        publish_all(pub, [(f"{first}/line1/q1", b"one retained", 1)], retain=True)
        receive(sub, 3)
    after_ms = int(time.time() * 1000)

    stored = poll_topic(rocketmq, first, 3)
    assert set(stored) == {f"{first}/line1/q0", f"{first}/line1/q1", f"{first}/line1/q2"}
    expected = {
        f"{first}/line1/q0": (0, "0", b"zero \x00\xff"),
        f"{first}/line1/q1": (1, "1", b"one retained"),
        f"{first}/line1/q2": (2, "0", "two \u00e9".encode()),
    }
    # The light queue of filter `<first>/#` in this namespace: `f:<filter>` escaped.
    lmq = f"%LMQ%{start_bridge.namespace}f|3A{first}|2F|23"
    keys = set()
    for tag, (qos, retain, body) in expected.items():
        message = stored[tag]
        props = message.properties
        assert message.topic == first
        assert message.body == body
        assert props["mqtt.qos"] == str(qos)
        assert props["mqtt.retain"] == retain
        assert props["mqtt.publisher"] == publisher_id
        assert props["mqtt.node"] == node_id
        assert before_ms <= int(props["mqtt.ts"]) <= after_ms
        assert re.fullmatch(rf"{re.escape(node_id)}-[0-9a-f]{{8}}-\d+", message.keys or ""), props
        keys.add(message.keys)
        if qos == 0:
            # QoS 0 is stored for analytics only: no queue entry.
            assert "INNER_MULTI_DISPATCH" not in props, props
        else:
            assert props["INNER_MULTI_DISPATCH"] == lmq
    assert len(keys) == 3, "message keys are not unique"

    # KEYS is indexed by the broker: the key finds exactly that message.
    qos1 = stored[f"{first}/line1/q1"]
    assert query_by_key(rocketmq, first, qos1.keys or "") == [qos1.properties["UNIQ_KEY"]]


def test_first_topic_level_is_escaped_into_the_rocketmq_topic_name(start_bridge, rocketmq):
    bridge = start_bridge()
    level = unique("caf\u00e9 ")  # `é` (2 UTF-8 bytes) and a space are not name characters
    escaped = level.replace("\u00e9", "|C3|A9").replace(" ", "|20")
    with paho_client(bridge.port) as pub:
        publish_all(pub, [(f"{level}/x", b"escaped", 1)])
    stored = poll_topic(rocketmq, escaped, 1)
    assert stored[f"{level}/x"].body == b"escaped"
    assert stored[f"{level}/x"].topic == escaped


# --- 2. offline persistent subscriber -------------------------------------------------------------


def test_offline_persistent_subscriber_gets_every_missed_message_on_reconnect_in_order_once(
    start_bridge,
):
    bridge = start_bridge()
    first = unique("inbox")
    client_id = unique("keeper-")
    with paho_client(bridge.port, client_id, clean_session=False) as sub:
        assert subscribe(sub, (f"{first}/+/events", 1)) == [1]
    payloads = [f"m{i:03d}".encode() for i in range(40)]
    with paho_client(bridge.port) as pub:
        publish_all(pub, [(f"{first}/dev7/events", p, 1) for p in payloads])

    with paho_client(bridge.port, client_id, clean_session=False) as sub:
        got = receive(sub, len(payloads))
    assert [m.payload for m in got] == payloads
    assert {(m.topic, m.qos) for m in got} == {(f"{first}/dev7/events", 1)}

    # Everything was acknowledged: the next reconnect gets nothing again.
    with paho_client(bridge.port, client_id, clean_session=False) as sub:
        assert_quiet(sub, 3.0)


# --- 3. wildcards ---------------------------------------------------------------------------------


def test_plus_and_hash_subscriptions_get_exactly_the_matching_messages_and_overlaps_once(
    start_bridge,
):
    bridge = start_bridge()
    t = unique("wild")
    other = unique("wildother")
    topics = [
        f"{t}/a/temp",  # + and #
        f"{t}/b/temp",  # + and #
        f"{t}/a/hum",  # # only
        f"{t}/a/b/temp",  # # only (+ is one level)
        t,  # # only (`#` matches the parent level, MQTT-4.7.1-2)
        f"{other}/a/temp",  # nothing
    ]
    with (
        paho_client(bridge.port) as plus,
        paho_client(bridge.port) as hash_,
        paho_client(bridge.port) as both,
        paho_client(bridge.port) as pub,
    ):
        assert subscribe(plus, (f"{t}/+/temp", 1)) == [1]
        assert subscribe(hash_, (f"{t}/#", 2)) == [2]
        assert subscribe(both, (f"{t}/+/temp", 1), (f"{t}/#", 2)) == [1, 2]
        messages = [(topic, f"{i}:{topic}".encode(), 1 + i % 2) for i, topic in enumerate(topics)]
        publish_all(pub, messages)

        got_plus = receive(plus, 2)
        got_hash = receive(hash_, 5)
        got_both = receive(both, 5)
    assert sorted(m.topic for m in got_plus) == sorted([f"{t}/a/temp", f"{t}/b/temp"])
    assert sorted(m.topic for m in got_hash) == sorted(topics[:5])
    assert sorted(m.topic for m in got_both) == sorted(topics[:5])
    payload_of = {topic: payload for topic, payload, _ in messages}
    for message in [*got_plus, *got_hash, *got_both]:
        assert message.payload == payload_of[message.topic]
    # Overlapping filters: once, at the highest granted QoS of the matching ones (min publish).
    qos_of = {topic: qos for topic, _, qos in messages}
    for message in got_both:
        assert message.qos == qos_of[message.topic], (message.topic, message.qos)


# --- 4. shared subscription -----------------------------------------------------------------------


def test_shared_subscription_splits_messages_between_members_each_delivered_once(start_bridge):
    bridge = start_bridge()
    t = unique("shared")
    share = f"$share/g/{t}/+/load"
    payloads = [f"job{i:03d}".encode() for i in range(40)]
    with (
        paho_client(bridge.port) as member1,
        paho_client(bridge.port) as member2,
        paho_client(bridge.port) as pub,
    ):
        assert subscribe(member1, (share, 1)) == [1]
        assert subscribe(member2, (share, 1)) == [1]
        publish_all(pub, [(f"{t}/m{i % 3}/load", p, 1) for i, p in enumerate(payloads)])
        got1: list = []
        got2: list = []
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while len(got1) + len(got2) < len(payloads) and time.monotonic() < deadline:
            got1 += member1.drain(1, 0.1)
            got2 += member2.drain(1, 0.1)
        assert_quiet(member1)
        assert_quiet(member2)
    received = Counter(m.payload for m in [*got1, *got2])
    assert sorted(received) == payloads, f"missing: {set(payloads) - set(received)}"
    assert all(n == 1 for n in received.values()), f"delivered twice: {received.most_common(3)}"
    assert got1 and got2, f"not split: {len(got1)} / {len(got2)}"


# --- 5. QoS 2 exactly once ------------------------------------------------------------------------


class DroppingReceiver(ExactlyOnceReceiver):
    """Drops its connection at every step of the QoS 2 handshake (before PUBREC, after PUBREC,
    before PUBCOMP), each time on every fourth passage through that step, and reconnects with
    its persistent session: the broker must resend (PUBLISH with DUP, or PUBREL), never send a
    message again as a new one."""

    def __init__(self, port: int, client_id: str) -> None:
        super().__init__(port, client_id)
        self.passed: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()

    def drop(self, step: str) -> bool:
        self.passed[step] += 1
        if self.passed[step] % 4 == 2:
            self.drops[step] += 1
            self.connect()
            return True
        return False


def test_qos2_is_delivered_exactly_once_per_subscriber_through_rocketmq(start_bridge):
    bridge = start_bridge()
    t = unique("exact")
    payloads = [f"q2-{i:03d}" for i in range(30)]
    flaky = DroppingReceiver(bridge.port, unique("flaky-"))
    flaky.connect()
    assert flaky.client is not None
    assert flaky.client.subscribe(f"{t}/#", 2) == [2]
    with paho_client(bridge.port) as steady, paho_client(bridge.port) as pub:
        assert subscribe(steady, (f"{t}/+", 2)) == [2]
        publish_all(pub, [(f"{t}/counter", p.encode(), 2) for p in payloads])
        got = receive(steady, len(payloads))
        flaky.receive(until=len(payloads), timeout=DELIVERY_TIMEOUT)
    assert [m.payload.decode() for m in got] == payloads
    assert {m.qos for m in got} == {2}
    assert set(flaky.delivered) == set(payloads), f"lost: {set(payloads) - set(flaky.delivered)}"
    twice = {p: n for p, n in flaky.delivered.items() if n != 1}
    assert not twice, f"QoS 2 delivered more than once: {twice}"
    steps = {"before-pubrec", "after-pubrec", "before-pubcomp"}
    assert set(flaky.drops) == steps, f"not every handshake step was dropped at: {flaky.drops}"
    # Nothing is redelivered after the last handshake completed.
    flaky.receive(until=len(payloads) + 1, timeout=QUIET)
    assert all(n == 1 for n in flaky.delivered.values())


# --- 6. retained across a restart -----------------------------------------------------------------


def test_retained_messages_survive_a_sigterm_restart_and_reach_new_subscribers_with_retain(
    start_bridge,
):
    bridge = start_bridge()
    t = unique("state")
    with paho_client(bridge.port) as pub:
        publish_all(pub, [(f"{t}/dev1", b"RUNNING", 1), (f"{t}/dev2", b"IDLE", 0)], retain=True)
        # QoS 0 retained is stored unawaited: a subscriber seeing it means it reached the node.
        # One that subscribed before the broker's answer came finds no retained message yet.
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while True:
            with paho_client(bridge.port) as probe:
                subscribe(probe, (f"{t}/dev2", 0))
                try:
                    assert probe.get(1.0).payload == b"IDLE"
                    break
                except queue.Empty:
                    assert time.monotonic() < deadline, "the retained QoS 0 message never came"
    bridge.stop()
    assert bridge.proc is not None and bridge.proc.returncode == 0, bridge.log_text()[-3000:]
    bridge.start()
    with paho_client(bridge.port) as sub:
        assert subscribe(sub, (f"{t}/+", 1)) == [1]
        got = {m.topic: m for m in receive(sub, 2)}
    assert (got[f"{t}/dev1"].payload, got[f"{t}/dev1"].retain, got[f"{t}/dev1"].qos) == (
        b"RUNNING",
        True,
        1,
    )
    assert (got[f"{t}/dev2"].payload, got[f"{t}/dev2"].retain, got[f"{t}/dev2"].qos) == (
        b"IDLE",
        True,
        0,
    )


# --- 7. kill -9 with queued messages --------------------------------------------------------------


class AckCountingPublisher(threading.Thread):
    """Publishes numbered QoS 1 messages until the connection breaks or `stop` is set;
    `acked` holds what was PUBACKed (a raw client, so a PUBACK is known exactly)."""

    def __init__(self, port: int, topic: str) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, timeout=10)
        self.client.connect(unique("pub-"))
        self.topic = topic
        self.acked: list[int] = []
        self.sent = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                number = self.sent
                packet_id = number % 65000 + 1
                self.client.send(
                    Publish(self.topic, f"n{number:05d}".encode(), 1, packet_id=packet_id)
                )
                self.sent += 1
                ack = self.client.recv()
                assert isinstance(ack, Puback) and ack.packet_id == packet_id, ack
                self.acked.append(number)
        except (ConnectionError, OSError) as exc:  # the bridge died: expected
            self.error = exc


def test_kill_9_restart_still_delivers_every_acknowledged_queued_message_to_offline_subscriber(
    start_bridge,
):
    bridge = start_bridge()
    t = unique("crash")
    topic = f"{t}/line1/press"
    client_id = unique("offline-")
    # The subscriber reads a few messages, acknowledges them, and goes offline.
    with paho_client(bridge.port, client_id, clean_session=False) as sub:
        assert subscribe(sub, (f"{t}/#", 1)) == [1]
        with paho_client(bridge.port) as pub:
            publish_all(pub, [(topic, f"early{i}".encode(), 1) for i in range(5)])
        assert [m.payload for m in receive(sub, 5)] == [f"early{i}".encode() for i in range(5)]

    publisher = AckCountingPublisher(bridge.port, topic)
    publisher.start()
    try:
        wait_until(lambda: len(publisher.acked) >= 60, DELIVERY_TIMEOUT, "60 PUBACKs")
        bridge.kill()  # SIGKILL in the middle of the publisher's traffic
        publisher.join(30)
        assert not publisher.is_alive(), "the publisher did not notice the bridge died"
    finally:
        publisher.stop.set()
        publisher.client.close()
    acked = list(publisher.acked)
    assert publisher.error is not None

    bridge.start()
    received: list[int] = []
    with paho_client(bridge.port, client_id, clean_session=False) as sub:
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while not set(acked) <= set(received) and time.monotonic() < deadline:
            for message in sub.drain(1, 0.2):
                assert message.topic == topic
                if message.payload.startswith(b"n"):
                    received.append(int(message.payload[1:]))
        # Messages sent but not acknowledged before the kill may follow; collect them too.
        while extra := sub.drain(1, QUIET):
            if extra[0].payload.startswith(b"n"):
                received.append(int(extra[0].payload[1:]))
    print(f"{len(acked)} of {publisher.sent} PUBACKed before kill -9; {len(received)} delivered")
    lost = sorted(set(acked) - set(received))
    assert not lost, f"{len(lost)} of {len(acked)} PUBACKed messages lost, first {lost[:10]}"
    # Nothing beyond what was sent; a publisher's messages to a topic arrive in order.
    assert set(received) <= set(range(publisher.sent))
    first_seen = list(dict.fromkeys(received))
    assert first_seen == sorted(first_seen), f"out of order: {first_seen}"


def test_mqtt5_metadata_and_message_expiry_hold_on_the_rocketmq_path(start_bridge):
    """A v5 session offline on store=rocketmq: what it gets on reconnect carries the
    publisher's metadata (through the broker's message properties) with the expiry reduced,
    a message whose expiry passed while queued is not delivered, and No Local holds for the
    publisher's own stored message."""
    bridge = start_bridge()
    t = unique("v5")
    with paho5(bridge.port, "v5-offline", session_expiry=300) as sub:
        sub.subscribe((f"{t}/#", sub_options(1, no_local=True)), SubscriptionIdentifier=9)
    with paho5(bridge.port, "v5-pub") as pub:
        pub.publish(f"{t}/short", b"gone", 1, MessageExpiryInterval=2)
        pub.publish(
            f"{t}/long",
            b"kept",
            1,
            MessageExpiryInterval=300,
            ResponseTopic=f"{t}/reply",
            CorrelationData=b"\x01\x02",
            ContentType="text/plain",
            UserProperty=[("k", "1"), ("k", "2"), ("a", "3")],
        )
    time.sleep(3.5)  # the first message's expiry passes while it is queued
    with paho5(bridge.port, "v5-offline", clean_start=False, session_expiry=300) as sub:
        assert sub.session_present
        got = sub.drain(1, timeout=DELIVERY_TIMEOUT)
        # The expired message would have come first (the queue's order); nothing follows.
        sub.publish(f"{t}/own", b"mine", 1)  # No Local: its own message is not sent back
        sub.assert_nothing(QUIET)
    assert [(m.topic, m.payload) for m in got] == [(f"{t}/long", b"kept")]
    props = got[0].properties
    assert props.ResponseTopic == f"{t}/reply"
    assert props.CorrelationData == b"\x01\x02"
    assert props.ContentType == "text/plain"
    assert props.UserProperty == [("k", "1"), ("k", "2"), ("a", "3")]
    assert props.SubscriptionIdentifier == [9]
    assert 0 < props.MessageExpiryInterval < 300
