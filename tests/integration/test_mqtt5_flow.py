"""MQTT 5.0 topic aliases and flow control against a real bridge process: aliases from client
to server (paho publishing) and from server to client (checked on the wire), the Receive
Maximum both ways and the Maximum Packet Size both ways. The raw client builds what no real
client sends (bad aliases, a duplicate property, too many unacknowledged messages) and reads
what paho does not show (the topic alias and the empty topic name on the wire)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from bridge.mqtt.packets import Publish, Pubrec, Pubrel, Subscription
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.mqtt5 import RawClient5, paho5, publish_bytes, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode


# -- topic aliases, client -> server -------------------------------------------------------------


def test_topic_alias_from_the_client_is_resolved_for_subscribers(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as subscriber, paho5(bridge.port) as publisher:
        assert subscriber.subscribe(("plant/#", sub_options(1))) == [1]
        publisher.publish("plant/line1/press3", b"with topic", qos=1, TopicAlias=1)
        publisher.publish("", b"alias only", qos=1, TopicAlias=1)
        publisher.publish("", b"alias only, QoS 0", qos=0, TopicAlias=1)
        got = subscriber.drain(3)
        # QoS 0 is sent at once, QoS 1 once stored: only the order within a QoS is kept.
        assert sorted((m.topic, m.payload) for m in got) == [
            ("plant/line1/press3", b"alias only"),
            ("plant/line1/press3", b"alias only, QoS 0"),
            ("plant/line1/press3", b"with topic"),
        ]
        assert publisher.disconnects.empty()


def test_topic_alias_can_be_moved_to_another_topic(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as subscriber, paho5(bridge.port) as publisher:
        assert subscriber.subscribe(("moved/#", sub_options(0))) == [0]
        publisher.publish("moved/a", b"1", qos=1, TopicAlias=2)
        publisher.publish("moved/b", b"2", qos=1, TopicAlias=2)
        publisher.publish("", b"3", qos=1, TopicAlias=2)
        assert [(m.topic, m.payload) for m in subscriber.drain(3)] == [
            ("moved/a", b"1"),
            ("moved/b", b"2"),
            ("moved/b", b"3"),
        ]


@pytest.mark.parametrize("alias", [0, 5], ids=["alias-0", "above-maximum"])
def test_topic_alias_0_or_above_the_maximum_gets_disconnect_0x94(
    bridge_factory: Callable[..., BridgeProcess], alias: int
) -> None:
    node = bridge_factory("topic_alias_maximum=4")
    client = RawClient5(node.port)
    assert client.connect("bad-alias").properties[P.TOPIC_ALIAS_MAXIMUM] == 4
    client.send_bytes(publish_bytes("t/alias", b"x", 1, 1, {P.TOPIC_ALIAS: alias}))
    client.expect_disconnect(R.TOPIC_ALIAS_INVALID)


def test_topic_alias_used_before_it_was_set_gets_disconnect_0x82(bridge: BridgeProcess) -> None:
    client = RawClient5(bridge.port)
    client.connect("unset-alias")
    client.send_bytes(publish_bytes("", b"x", 0, None, {P.TOPIC_ALIAS: 3}))
    client.expect_disconnect(R.PROTOCOL_ERROR)


def test_a_property_given_twice_gets_disconnect_0x82(bridge: BridgeProcess) -> None:
    client = RawClient5(bridge.port)
    client.connect("twice")
    data = publish_bytes(
        "t/dup", b"x", 1, 1, {P.CONTENT_TYPE: "text/plain"}, {P.CONTENT_TYPE: "text/html"}
    )
    client.send_bytes(data)
    client.expect_disconnect(R.PROTOCOL_ERROR)


# -- topic aliases, server -> client -------------------------------------------------------------


def test_server_sends_a_repeated_topic_as_an_alias_with_an_empty_topic_name(
    bridge: BridgeProcess,
) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("alias-reader", properties={P.TOPIC_ALIAS_MAXIMUM: 10})
    assert reader.subscribe_many(Subscription("fleet/#", 1)) == [1]
    with paho5(bridge.port) as publisher:
        for i in range(3):
            publisher.publish("fleet/truck42/position", f"p{i}".encode(), qos=1)
    first, second, third = (reader.recv_publish() for _ in range(3))
    for message in (first, second, third):
        reader.acknowledge(message)
    alias = first.properties[P.TOPIC_ALIAS]
    assert 1 <= alias <= 10
    assert first.topic == "fleet/truck42/position"
    assert (second.topic, second.properties[P.TOPIC_ALIAS]) == ("", alias)
    assert (third.topic, third.properties[P.TOPIC_ALIAS]) == ("", alias)
    assert [m.payload for m in (first, second, third)] == [b"p0", b"p1", b"p2"]


def test_server_aliases_stay_within_the_clients_topic_alias_maximum_and_resolve_right(
    bridge: BridgeProcess,
) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("two-aliases", properties={P.TOPIC_ALIAS_MAXIMUM: 2})
    assert reader.subscribe_many(Subscription("lru/#", 0)) == [0]
    sent = ["lru/aaa", "lru/bbb", "lru/aaa", "lru/ccc", "lru/bbb", "lru/aaa", "lru/ccc"]
    with paho5(bridge.port) as publisher:
        for i, topic in enumerate(sent):
            publisher.publish(topic, str(i).encode(), qos=1)
    known: dict[int, str] = {}
    resolved = []
    for _ in sent:
        message = reader.recv_publish()
        alias = message.properties.get(P.TOPIC_ALIAS)
        if alias is not None:
            assert 1 <= alias <= 2, alias
            if message.topic:
                known[alias] = message.topic
            resolved.append(known[alias] if not message.topic else message.topic)
        else:
            resolved.append(message.topic)
    assert resolved == sent


def test_no_aliases_are_sent_to_a_client_that_did_not_ask_for_them(bridge: BridgeProcess) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("no-aliases")  # no Topic Alias Maximum: 0
    assert reader.subscribe_many(Subscription("noalias/#", 0)) == [0]
    with paho5(bridge.port) as publisher:
        for i in range(3):
            publisher.publish("noalias/some/long/topic", str(i).encode(), qos=1)
    for _ in range(3):
        message = reader.recv_publish()
        assert message.topic == "noalias/some/long/topic"
        assert P.TOPIC_ALIAS not in message.properties


# -- Receive Maximum -----------------------------------------------------------------------------


def test_bridge_never_has_more_unacknowledged_qos1_messages_than_the_clients_receive_maximum(
    bridge: BridgeProcess,
) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("slow-acker", properties={P.RECEIVE_MAXIMUM: 3})
    assert reader.subscribe_many(Subscription("rm/#", 1)) == [1]
    with paho5(bridge.port) as publisher:
        for i in range(10):
            publisher.publish("rm/x", f"m{i}".encode(), qos=1)
    window = [reader.recv_publish() for _ in range(3)]
    reader.assert_nothing(1.0)  # three unacknowledged: the fourth must wait
    received = list(window)
    reader.acknowledge(window[0])
    received.append(reader.recv_publish())
    reader.assert_nothing(0.5)  # one acknowledged, one more sent, not two
    unacked = received[1:]
    deadline = time.monotonic() + 10
    while len(received) < 10:
        assert time.monotonic() < deadline, f"{len(received)} of 10 received"
        reader.acknowledge(unacked.pop(0))
        message = reader.recv_publish()
        received.append(message)
        unacked.append(message)
        assert len(unacked) <= 3
    assert [m.payload for m in received] == [f"m{i}".encode() for i in range(10)]


def test_client_exceeding_the_bridges_receive_maximum_gets_disconnect_0x93(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("receive_maximum=5")
    client = RawClient5(node.port)
    assert client.connect("eager").properties[P.RECEIVE_MAXIMUM] == 5
    # QoS 2 messages count against the Receive Maximum until PUBCOMP: without PUBREL they stay
    # unacknowledged however fast the bridge answers PUBREC.
    for packet_id in range(1, 6):
        client.send(Publish("rm/in", b"x", 2, packet_id=packet_id))
        assert client.recv() == Pubrec(packet_id)
    client.send(Pubrel(1))  # completes one: room for one more
    assert client.recv().packet_id == 1
    client.send(Publish("rm/in", b"x", 2, packet_id=6))
    assert client.recv() == Pubrec(6)
    client.send(Publish("rm/in", b"x", 2, packet_id=7))  # a sixth unacknowledged
    disconnect = client.expect_disconnect(R.RECEIVE_MAXIMUM_EXCEEDED)
    assert "Receive Maximum" in disconnect.properties[P.REASON_STRING]


# -- Maximum Packet Size -------------------------------------------------------------------------


def test_message_larger_than_a_subscribers_maximum_packet_size_is_not_sent_to_it(
    bridge: BridgeProcess,
) -> None:
    with (
        paho5(bridge.port, MaximumPacketSize=256) as small,
        paho5(bridge.port) as unlimited,
        paho5(bridge.port) as publisher,
    ):
        assert small.subscribe(("mps/#", sub_options(1))) == [1]
        assert unlimited.subscribe(("mps/#", sub_options(1))) == [1]
        publisher.publish("mps/x", b"L" * 1000, qos=1)
        publisher.publish("mps/x", b"small", qos=1)
        assert small.get().payload == b"small"
        small.assert_nothing(0.5)
        assert [m.payload for m in unlimited.drain(2)] == [b"L" * 1000, b"small"]
        assert small.disconnects.empty()


def test_too_large_incoming_packet_gets_disconnect_0x95(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("max_packet_size=1024")
    client = RawClient5(node.port)
    assert client.connect("too-big").properties[P.MAXIMUM_PACKET_SIZE] == 1024
    client.send(Publish("big/x", b"B" * 1000, 1, packet_id=1))  # fits
    assert client.recv().packet_id == 1
    client.send(Publish("big/x", b"B" * 2000, 1, packet_id=2))
    client.expect_disconnect(R.PACKET_TOO_LARGE)
    node.wait_for_log("exceeds max_packet_size=1024")
