"""MQTT 5.0 SUBSCRIBE and UNSUBSCRIBE against a real bridge process: the subscription options
(No Local, Retain As Published, Retain Handling), Subscription Identifiers, SUBACK and UNSUBACK
reason codes, and shared subscriptions with v5 clients. paho-mqtt is the v5 client; the raw
client reads what paho does not show (every PUBLISH on the wire) and sends what the spec
forbids (No Local on a shared subscription)."""

from __future__ import annotations

import contextlib
import queue
import time
from collections import Counter

import pytest

from bridge.mqtt import codec
from bridge.mqtt.packets import Publish, Subscribe, Subscription
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.mqtt5 import RawClient5, paho5, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode


# -- No Local ------------------------------------------------------------------------------------


def test_no_local_subscriber_does_not_get_its_own_messages_but_gets_others(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as chat, paho5(bridge.port) as other, paho5(bridge.port) as plain:
        assert chat.subscribe(("chat/room", sub_options(1, no_local=True))) == [1]
        assert plain.subscribe(("chat/room", sub_options(1))) == [1]
        chat.publish("chat/room", b"from me", qos=1)
        other.publish("chat/room", b"from someone else", qos=1)
        assert chat.get().payload == b"from someone else"
        chat.assert_nothing(0.5)
        assert sorted(m.payload for m in plain.drain(2)) == [b"from me", b"from someone else"]


def test_no_local_also_holds_for_a_qos0_message(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as chat, paho5(bridge.port) as other:
        assert chat.subscribe(("chat0/room", sub_options(0, no_local=True))) == [0]
        chat.publish("chat0/room", b"from me", qos=0)
        other.publish("chat0/room", b"from someone else", qos=0)
        assert chat.get().payload == b"from someone else"
        chat.assert_nothing(0.5)


# -- Retain As Published -------------------------------------------------------------------------


def test_retain_as_published_keeps_the_retain_flag_on_live_messages(bridge: BridgeProcess) -> None:
    with (
        paho5(bridge.port) as keeps,
        paho5(bridge.port) as clears,
        paho5(bridge.port) as publisher,
    ):
        assert keeps.subscribe(("rap/#", sub_options(1, retain_as_published=True))) == [1]
        assert clears.subscribe(("rap/#", sub_options(1))) == [1]
        publisher.publish("rap/state", b"retained", qos=1, retain=True)
        publisher.publish("rap/state", b"not retained", qos=1, retain=False)
        assert [(m.payload, m.retain) for m in keeps.drain(2)] == [
            (b"retained", True),
            (b"not retained", False),
        ]
        assert [(m.payload, m.retain) for m in clears.drain(2)] == [
            (b"retained", False),
            (b"not retained", False),
        ]


# -- Retain Handling -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retain_handling", "on_first", "on_again"),
    [(0, True, True), (1, True, False), (2, False, False)],
    ids=["0-always", "1-new-subscription-only", "2-never"],
)
def test_retain_handling_decides_when_retained_messages_are_sent(
    bridge: BridgeProcess, retain_handling: int, on_first: bool, on_again: bool
) -> None:
    with paho5(bridge.port) as publisher:
        publisher.publish("rh/state", b"last value", qos=1, retain=True)
    with paho5(bridge.port) as subscriber:
        option = sub_options(1, retain_handling=retain_handling)
        for expected in (on_first, on_again):  # subscribe, then the same filter again
            assert subscriber.subscribe(("rh/#", option)) == [1]
            if expected:
                message = subscriber.get()
                assert (message.payload, message.retain) == (b"last value", True)
            subscriber.assert_nothing(0.5)


# -- Subscription Identifiers --------------------------------------------------------------------


def test_overlapping_subscriptions_give_one_message_with_both_identifiers_at_the_higher_qos(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as subscriber, paho5(bridge.port) as publisher:
        assert subscriber.subscribe(("sid/#", sub_options(0)), SubscriptionIdentifier=1) == [0]
        assert subscriber.subscribe(("sid/+/x", sub_options(1)), SubscriptionIdentifier=2) == [1]
        publisher.publish("sid/a/x", b"both", qos=2)
        message = subscriber.get()
        assert message.payload == b"both"
        assert message.qos == 1
        assert sorted(message.properties.SubscriptionIdentifier) == [1, 2]
        subscriber.assert_nothing(0.5)  # one message, not one per subscription
        publisher.publish("sid/a/y", b"first only", qos=1)
        message = subscriber.get()
        assert (message.payload, message.qos) == (b"first only", 0)
        assert message.properties.SubscriptionIdentifier == [1]


def test_subscription_identifiers_on_the_wire_for_overlapping_subscriptions(
    bridge: BridgeProcess,
) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("sid-wire")
    assert reader.subscribe_many(
        Subscription("wire/#", 0), packet_id=1, properties={P.SUBSCRIPTION_IDENTIFIER: [1]}
    ) == [0]
    assert reader.subscribe_many(
        Subscription("wire/+", 1), packet_id=2, properties={P.SUBSCRIPTION_IDENTIFIER: [2]}
    ) == [1]
    with paho5(bridge.port) as publisher:
        publisher.publish("wire/t", b"x", qos=1)
    message = reader.recv_publish()
    assert message.qos == 1
    assert sorted(message.properties[P.SUBSCRIPTION_IDENTIFIER]) == [1, 2]
    reader.acknowledge(message)
    reader.assert_nothing(0.5)


def test_a_subscription_without_identifier_sends_none(bridge: BridgeProcess) -> None:
    reader = RawClient5(bridge.port)
    reader.connect("no-sid")
    assert reader.subscribe_many(Subscription("nosid/#", 0)) == [0]
    with paho5(bridge.port) as publisher:
        publisher.publish("nosid/t", b"x", qos=0)
    assert P.SUBSCRIPTION_IDENTIFIER not in reader.recv_publish().properties


# -- SUBACK and UNSUBACK -------------------------------------------------------------------------


def test_suback_grants_each_qos_and_refuses_an_invalid_filter_with_0x8F(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    client.connect("suback-codes")
    codes = client.subscribe_many(
        Subscription("codes/zero", 0),
        Subscription("codes/+/one", 1),
        Subscription("codes/#", 2),
        Subscription("codes/#/bad", 1),
        Subscription("codes+/bad", 0),
    )
    assert codes == [0, 1, 2, R.TOPIC_FILTER_INVALID, R.TOPIC_FILTER_INVALID]
    client.send(Subscribe(2, [Subscription("codes/after", 1)]))  # the connection goes on
    assert client.recv().return_codes == [1]


def test_unsuback_says_0x00_for_a_subscription_and_0x11_for_none(bridge: BridgeProcess) -> None:
    client = RawClient5(bridge.port)
    client.connect("unsub-codes")
    assert client.subscribe_many(Subscription("unsub/a", 1)) == [1]
    assert client.unsubscribe("unsub/a", "unsub/never", packet_id=2) == [
        R.SUCCESS,
        R.NO_SUBSCRIPTION_EXISTED,
    ]
    assert client.unsubscribe("unsub/a", packet_id=3) == [R.NO_SUBSCRIPTION_EXISTED]
    with paho5(bridge.port) as publisher:
        publisher.publish("unsub/a", b"after unsubscribe", qos=1)
    client.assert_nothing(0.5)


# -- shared subscriptions ------------------------------------------------------------------------


def test_shared_subscription_splits_messages_across_v5_members_each_once(
    bridge: BridgeProcess,
) -> None:
    with (
        paho5(bridge.port) as one,
        paho5(bridge.port) as two,
        paho5(bridge.port) as publisher,
    ):
        assert one.subscribe(("$share/workers/jobs/#", sub_options(1))) == [1]
        assert two.subscribe(("$share/workers/jobs/#", sub_options(1))) == [1]
        for i in range(20):
            publisher.publish(f"jobs/{i % 4}", f"job-{i}".encode(), qos=1)
        got: list[list[bytes]] = [[], []]
        deadline = time.monotonic() + 10
        while sum(map(len, got)) < 20 and time.monotonic() < deadline:
            for member, payloads in zip((one, two), got, strict=True):
                with contextlib.suppress(queue.Empty):
                    payloads.append(member.messages.get(timeout=0.05).payload)
        seen = Counter(got[0] + got[1])
        assert seen == Counter(f"job-{i}".encode() for i in range(20))  # each exactly once
        assert got[0] and got[1], [len(payloads) for payloads in got]
        one.assert_nothing(0.3)
        two.assert_nothing(0.3)


def test_shared_subscription_carries_the_members_subscription_identifier(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as member, paho5(bridge.port) as publisher:
        assert member.subscribe(("$share/g/sjobs/#", sub_options(1)), SubscriptionIdentifier=7) == [
            1
        ]
        publisher.publish("sjobs/1", b"x", qos=1)
        assert member.get().properties.SubscriptionIdentifier == [7]


def test_no_local_on_a_shared_subscription_gets_disconnect_0x82(bridge: BridgeProcess) -> None:
    client = RawClient5(bridge.port)
    client.connect("shared-no-local")
    # The codec will not write it: encode without No Local, then set the option bit (0x04).
    data = bytearray(codec.encode(Subscribe(1, [Subscription("$share/g/t/#", 1)]), 5))
    data[-1] |= 0x04
    client.send_bytes(bytes(data))
    disconnect = client.expect_disconnect(R.PROTOCOL_ERROR)
    assert "MQTT-3.8.3-4" in disconnect.properties[P.REASON_STRING]


def test_v5_publisher_reaches_a_shared_group_of_raw_v5_members_once(
    bridge: BridgeProcess,
) -> None:
    members = []
    for i in range(2):
        member = RawClient5(bridge.port)
        member.connect(f"member-{i}")
        assert member.subscribe_many(Subscription("$share/raw/rjobs/#", 0)) == [0]
        members.append(member)
    with paho5(bridge.port) as publisher:
        for i in range(6):
            publisher.publish("rjobs/x", str(i).encode(), qos=1)
    received: list[bytes] = []
    for member in members:
        while True:
            try:
                packet = member.recv(0.7)
            except TimeoutError:
                break
            assert isinstance(packet, Publish)
            received.append(packet.payload)
    assert sorted(received) == [str(i).encode() for i in range(6)]
