"""Each client library against one bridge node: QoS 0/1/2, a persistent session's offline
messages, MQTT 5 properties end to end, topic aliases and a shared subscription. MQTT.js runs
every scenario over TCP and over WebSocket."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from bridge.mqtt.decoder import Decoder
from bridge.mqtt.packets import Publish
from bridge.mqtt.properties import PropertyId
from tests.interop.conftest import Client, SingleNode
from tests.interop.driver import Driver
from tests.support.tcpproxy import TcpProxy

Drivers = Callable[[str], Driver]


def client_id(name: str) -> str:
    return f"interop-{name}-{uuid.uuid4().hex[:8]}"


def persistent(version: int) -> dict[str, object]:
    """CONNECT options of a session that outlives its connection."""
    return {"clean": False, "session_expiry": 300} if version == 5 else {"clean": False}


@pytest.mark.parametrize("version", [4, 5])
def test_messages_of_each_qos_reach_the_subscriber_once_at_the_granted_qos(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str, version: int
) -> None:
    url = single_node.url(client)
    sub, pub = drivers("sub"), drivers("pub")
    sub.connect(url, client_id("sub"), version=version)
    assert sub.subscribe(f"{topic}/#", qos=2) == [2]
    pub.connect(url, client_id("pub"), version=version)
    for qos in (0, 1, 2):
        pub.publish(f"{topic}/q{qos}", f"message at qos {qos}", qos)

    got = sub.messages(3)

    assert sorted((m["topic"], m["payload"], m["qos"]) for m in got) == [
        (f"{topic}/q{qos}", f"message at qos {qos}", qos) for qos in (0, 1, 2)
    ]
    assert sub.quiet(0.3) == []


@pytest.mark.parametrize("version", [4, 5])
def test_persistent_session_receives_what_was_published_while_it_was_away(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str, version: int
) -> None:
    url = single_node.url(client)
    sub_id = client_id("sub")
    first = drivers("sub")
    assert (
        first.connect(url, sub_id, version=version, **persistent(version))["session_present"]
        is False
    )
    first.subscribe(f"{topic}/#", qos=2)
    first.call("close")
    pub = drivers("pub")
    pub.connect(url, client_id("pub"), version=version)
    for i in range(5):
        pub.publish(f"{topic}/q1", f"q1-{i}", 1)
        pub.publish(f"{topic}/q2", f"q2-{i}", 2)

    again = drivers("sub-again")
    connack = again.connect(url, sub_id, version=version, **persistent(version))
    got = again.messages(10, timeout=15)
    got += again.quiet(0.5)

    assert connack["session_present"] is True
    q1 = [m["payload"] for m in got if m["topic"] == f"{topic}/q1"]
    q2 = [m["payload"] for m in got if m["topic"] == f"{topic}/q2"]
    # QoS 1 may come twice (a copy in flight on the closed connection is sent again), in order;
    # QoS 2 exactly once, in order.
    assert list(dict.fromkeys(q1)) == [f"q1-{i}" for i in range(5)]
    assert q2 == [f"q2-{i}" for i in range(5)]


PROPERTIES = {
    "user_properties": [["site", "plant-7"], ["site", "line-2"], ["unit", "°C"]],
    "response_topic": "interop/replies/7",
    "correlation_data": "00ff10a5",
    "content_type": "application/json",
    "payload_format": 1,
    "message_expiry": 300,
}


def test_mqtt5_properties_reach_the_subscriber_unchanged_with_its_subscription_identifier(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str
) -> None:
    url = single_node.url(client)
    sub, pub = drivers("sub"), drivers("pub")
    sub.connect(url, client_id("sub"), version=5)
    sub.subscribe(f"{topic}/#", qos=1, subscription_id=7)
    pub.connect(url, client_id("pub"), version=5)
    pub.publish(f"{topic}/props", '{"t": 21.5}', 1, properties=PROPERTIES)

    (message,) = sub.messages(1)

    props = message["properties"]
    assert message["payload"] == '{"t": 21.5}'
    for key in ("user_properties", "response_topic", "correlation_data", "content_type"):
        assert props[key] == PROPERTIES[key], key
    assert props["payload_format"] == 1
    assert props["subscription_ids"] == [7]
    # The expiry is what is left of it: never more than was sent, not yet gone.
    assert 0 < props["message_expiry"] <= 300


def publishes_on_the_wire(sent: bytes) -> list[Publish]:
    """The PUBLISH packets among what a 5.0 client sent (its CONNECT first)."""
    decoder = Decoder()
    decoder.feed(sent)
    return [p for p in decoder.packets() if isinstance(p, Publish)]


def test_publishes_sent_through_a_topic_alias_reach_the_subscriber_under_their_topic(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str
) -> None:
    url = single_node.url(client)
    # Over TCP the publisher goes through a proxy that keeps what it sent, to see the aliases
    # on the wire (over WebSocket the same client code runs inside WebSocket frames).
    proxy = TcpProxy(single_node.node.port).start() if client.transport == "tcp" else None
    try:
        sub, pub = drivers("sub"), drivers("pub")
        sub.connect(url, client_id("sub"), version=5)
        sub.subscribe(f"{topic}/#", qos=1)
        pub_url = f"mqtt://127.0.0.1:{proxy.port}" if proxy else url
        pub.connect(pub_url, client_id("pub"), version=5)
        for i in range(3):
            pub.publish(f"{topic}/aliased", f"a{i}", 1, properties={"topic_alias": 1})
        pub.publish(f"{topic}/plain", "p", 1)

        got = sub.messages(4)
    finally:
        if proxy:
            proxy.stop()

    assert [(m["topic"], m["payload"]) for m in got] == [
        *((f"{topic}/aliased", f"a{i}") for i in range(3)),
        (f"{topic}/plain", "p"),
    ]
    if proxy:
        aliased = publishes_on_the_wire(bytes(proxy.sent[0]))[:3]
        aliases = {p.properties.get(PropertyId.TOPIC_ALIAS) for p in aliased}
        assert len(aliases) == 1 and None not in aliases, aliased
        # The first sets the alias; the others name their topic through it alone.
        assert [p.topic for p in aliased] == [f"{topic}/aliased", "", ""]


def test_messages_the_server_sends_through_topic_aliases_arrive_under_their_topic(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str
) -> None:
    url = single_node.url(client)
    sub, pub = drivers("sub"), drivers("pub")
    # The subscriber allows the server aliases: the bridge sends a topic once, then its alias.
    sub.connect(url, client_id("sub"), version=5, topic_alias_maximum=10)
    sub.subscribe(f"{topic}/#", qos=1)
    pub.connect(url, client_id("pub"), version=5)
    sent = [(f"{topic}/{name}", f"{name}{i}") for i in range(3) for name in ("x", "y")]
    for subject, payload in sent:
        pub.publish(subject, payload, 1)

    got = sub.messages(len(sent))

    assert [(m["topic"], m["payload"]) for m in got] == sent


def test_shared_subscription_spreads_messages_over_both_members_each_message_once(
    client: Client, single_node: SingleNode, drivers: Drivers, topic: str
) -> None:
    url = single_node.url(client)
    group = f"g{uuid.uuid4().hex[:6]}"
    members = [drivers("member-a"), drivers("member-b")]
    for member in members:
        member.connect(url, client_id("member"), version=5)
        assert member.subscribe(f"$share/{group}/{topic}/#", qos=1) == [1]
    pub = drivers("pub")
    pub.connect(url, client_id("pub"), version=5)
    sent = [f"s{i}" for i in range(20)]
    for payload in sent:
        pub.publish(f"{topic}/shared", payload, 1)

    received: list[list[str]] = [[], []]
    deadline = time.monotonic() + 15
    while sum(map(len, received)) < len(sent) and time.monotonic() < deadline:
        for got, member in zip(received, members, strict=True):
            got += [m["payload"] for m in member.quiet(0.1)]
    for got, member in zip(received, members, strict=True):
        got += [m["payload"] for m in member.quiet(0.3)]

    assert sorted(received[0] + received[1]) == sorted(sent)
    assert received[0] and received[1], received
