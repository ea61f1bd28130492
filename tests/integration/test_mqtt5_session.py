"""MQTT 5.0 session and message lifetimes against a real bridge process: the Session Expiry
Interval (on CONNECT and changed on DISCONNECT), Clean Start, and the Message Expiry Interval of
queued and retained messages, with paho-mqtt as the v5 client (the raw client only to send a
DISCONNECT the spec forbids)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bridge.mqtt.packets import Disconnect, Subscription
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.mqtt5 import RawClient5, paho5, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode


def subscribe_then_go_offline(port: int, client_id: str, topic_filter: str, expiry: int) -> None:
    """A v5 session with `expiry` subscribes at QoS 1 and disconnects."""
    with paho5(port, client_id, session_expiry=expiry) as client:
        assert client.subscribe((topic_filter, sub_options(1))) == [1]


def publish_qos1(port: int, topic: str, *payloads: bytes, **props: Any) -> None:
    with paho5(port) as publisher:
        for payload in payloads:
            assert publisher.publish(topic, payload, qos=1, **props) == 0


# -- Session Expiry Interval ---------------------------------------------------------------------


def test_session_expiry_0_ends_the_session_with_the_connection(bridge: BridgeProcess) -> None:
    subscribe_then_go_offline(bridge.port, "short-lived", "se0/#", expiry=0)
    publish_qos1(bridge.port, "se0/x", b"while away")
    with paho5(bridge.port, "short-lived", clean_start=False) as again:
        assert again.session_present is False
        again.assert_nothing(1.0)


def test_session_expiry_above_0_keeps_the_session_and_its_offline_qos1_messages(
    bridge: BridgeProcess,
) -> None:
    subscribe_then_go_offline(bridge.port, "kept", "se60/#", expiry=60)
    publish_qos1(bridge.port, "se60/x", b"one", b"two", b"three")
    with paho5(bridge.port, "kept", clean_start=False, session_expiry=60) as again:
        assert again.session_present is True
        got = again.drain(3)
        assert [(m.topic, m.payload, m.qos) for m in got] == [
            ("se60/x", b"one", 1),
            ("se60/x", b"two", 1),
            ("se60/x", b"three", 1),
        ]


def test_session_is_discarded_once_its_expiry_interval_has_passed(bridge: BridgeProcess) -> None:
    subscribe_then_go_offline(bridge.port, "brief", "se1/#", expiry=1)
    publish_qos1(bridge.port, "se1/x", b"too late")
    bridge.wait_for_log("session brief expired after", timeout=5)
    with paho5(bridge.port, "brief", clean_start=False, session_expiry=60) as again:
        assert again.session_present is False
        again.assert_nothing(1.0)


def test_session_expiry_set_to_0_on_disconnect_ends_a_session_that_had_60(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    client.connect("changes-mind", properties={P.SESSION_EXPIRY_INTERVAL: 60})
    assert client.subscribe("se-change/#", 1) == [1]
    client.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 0})
    publish_qos1(bridge.port, "se-change/x", b"nobody keeps this")
    with paho5(bridge.port, "changes-mind", clean_start=False, session_expiry=60) as again:
        assert again.session_present is False
        again.assert_nothing(1.0)


def test_session_expiry_raised_on_disconnect_keeps_a_session_past_its_connect_interval(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    client.connect("extends", properties={P.SESSION_EXPIRY_INTERVAL: 1})
    assert client.subscribe("se-extend/#", 1) == [1]
    client.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 60})
    publish_qos1(bridge.port, "se-extend/x", b"kept for 60 s")
    time.sleep(2.0)  # past the 1 s asked on CONNECT (nothing to wait for: it must NOT expire)
    assert "session extends expired" not in bridge.log_text()
    with paho5(bridge.port, "extends", clean_start=False, session_expiry=60) as again:
        assert again.session_present is True
        assert again.get().payload == b"kept for 60 s"


def test_disconnect_setting_session_expiry_when_connect_had_0_gets_disconnect_0x82(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    client.connect("was-zero")  # no Session Expiry Interval: 0
    client.send(Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 30}))
    disconnect = client.expect_disconnect(R.PROTOCOL_ERROR)
    assert "MQTT-3.14.2-2" in disconnect.properties[P.REASON_STRING]


def test_clean_start_discards_the_old_session_and_its_subscriptions(bridge: BridgeProcess) -> None:
    subscribe_then_go_offline(bridge.port, "restarter", "clean/#", expiry=60)
    publish_qos1(bridge.port, "clean/x", b"queued for the old session")
    with paho5(bridge.port, "restarter", clean_start=True, session_expiry=60) as fresh:
        assert fresh.session_present is False
        publish_qos1(bridge.port, "clean/x", b"the old subscription is gone")
        fresh.assert_nothing(1.0)


# -- Message Expiry Interval ---------------------------------------------------------------------


def test_queued_message_whose_expiry_passed_is_not_delivered(bridge: BridgeProcess) -> None:
    subscribe_then_go_offline(bridge.port, "late-reader", "mexp/#", expiry=60)
    publish_qos1(bridge.port, "mexp/x", b"expires in 2 s", MessageExpiryInterval=2)
    publish_qos1(bridge.port, "mexp/x", b"never expires")
    time.sleep(3.0)  # the reader stays away past the expiry
    with paho5(bridge.port, "late-reader", clean_start=False, session_expiry=60) as reader:
        assert reader.session_present is True
        assert reader.get().payload == b"never expires"
        reader.assert_nothing(0.5)


def test_queued_message_is_delivered_with_its_expiry_reduced_by_the_time_it_waited(
    bridge: BridgeProcess,
) -> None:
    subscribe_then_go_offline(bridge.port, "waiting-reader", "mexp60/#", expiry=60)
    publish_qos1(bridge.port, "mexp60/x", b"good for a minute", MessageExpiryInterval=60)
    published = time.monotonic()
    time.sleep(2.2)
    with paho5(bridge.port, "waiting-reader", clean_start=False, session_expiry=60) as reader:
        message = reader.get()
        waited = time.monotonic() - published
        assert message.payload == b"good for a minute"
        remaining = message.properties.MessageExpiryInterval
        assert 60 - waited - 1 <= remaining <= 58, (remaining, waited)


def test_live_message_keeps_its_message_expiry_interval(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as reader:
        assert reader.subscribe(("mexp-live/#", sub_options(1))) == [1]
        publish_qos1(bridge.port, "mexp-live/x", b"fresh", MessageExpiryInterval=30)
        message = reader.get()
        assert message.properties.MessageExpiryInterval in (29, 30)


def test_retained_message_is_not_sent_to_a_subscriber_after_it_expired(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as publisher:
        publisher.publish("rexp/short", b"stale soon", qos=1, retain=True, MessageExpiryInterval=1)
        publisher.publish("rexp/forever", b"still here", qos=1, retain=True)
    time.sleep(2.1)  # past the retained message's expiry
    with paho5(bridge.port) as late:
        assert late.subscribe(("rexp/#", sub_options(1))) == [1]
        message = late.get()
        assert (message.topic, message.payload, message.retain) == (
            "rexp/forever",
            b"still here",
            True,
        )
        late.assert_nothing(0.5)


def test_retained_message_before_its_expiry_is_sent_with_the_remaining_interval(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as publisher:
        publisher.publish("rexp2/t", b"valid", qos=1, retain=True, MessageExpiryInterval=60)
    time.sleep(1.1)
    raw = RawClient5(bridge.port)
    raw.connect("retained-reader")
    assert raw.subscribe_many(Subscription("rexp2/#", 1)) == [1]
    message = raw.recv_publish()
    assert (message.payload, message.retain) == (b"valid", True)
    assert 57 <= message.properties[P.MESSAGE_EXPIRY_INTERVAL] <= 59
    raw.acknowledge(message)
