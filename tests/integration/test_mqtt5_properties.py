"""MQTT 5.0 request/response metadata end to end through a real bridge process: Response Topic,
Correlation Data, User Properties (order and repeated names kept), Content Type and Payload Format
Indicator arrive unchanged live at each QoS, from the store for a subscriber that was offline,
and on retained messages; a payload that breaks its Payload Format Indicator is refused with
0x99. paho-mqtt on both ends, mosquitto_pub/mosquitto_sub as a user would run them, and the raw
client for the PUBREC paho does not report."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.mqtt.packets import Publish, Subscription
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.mqtt5 import (
    RawClient5,
    mosquitto_pub,
    mosquitto_sub_process,
    mosquitto_subscribe_session,
    paho5,
    sub_options,
    user_property_pairs,
)
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode

PAYLOAD = '{"pressure": 3.2, "unit": "bar", "note": "Überdruck €"}'.encode()
METADATA: dict[str, Any] = {
    "ResponseTopic": "replies/backend-9",
    "CorrelationData": b"\x00\x01req-42\xff",
    "UserProperty": [("trace", "a1"), ("unit", "bar"), ("trace", "b2"), ("empty", "")],
    "ContentType": "application/json; charset=utf-8",
    "PayloadFormatIndicator": 1,
}


def assert_metadata_unchanged(message: Any) -> None:
    """The message arrived with exactly the payload and metadata it was published with."""
    assert message.payload == PAYLOAD
    props = message.properties
    assert props.ResponseTopic == METADATA["ResponseTopic"]
    assert props.CorrelationData == METADATA["CorrelationData"]
    assert props.UserProperty == METADATA["UserProperty"]
    assert props.ContentType == METADATA["ContentType"]
    assert props.PayloadFormatIndicator == 1


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_request_response_metadata_arrives_unchanged_live(bridge: BridgeProcess, qos: int) -> None:
    with paho5(bridge.port) as responder, paho5(bridge.port) as requester:
        assert responder.subscribe(("requests/#", sub_options(2))) == [2]
        requester.publish("requests/pressure", PAYLOAD, qos=qos, **METADATA)
        message = responder.get()
        assert message.qos == qos
        assert_metadata_unchanged(message)


@pytest.mark.parametrize("qos", [1, 2])
def test_request_response_metadata_arrives_unchanged_from_the_store_after_being_offline(
    bridge: BridgeProcess, qos: int
) -> None:
    with paho5(bridge.port, "offline-responder", session_expiry=60) as responder:
        assert responder.subscribe(("stored/#", sub_options(2))) == [2]
    with paho5(bridge.port) as requester:
        requester.publish("stored/pressure", PAYLOAD, qos=qos, **METADATA)
    with paho5(bridge.port, "offline-responder", clean_start=False, session_expiry=60) as responder:
        assert responder.session_present is True
        message = responder.get()
        assert message.qos == qos
        assert_metadata_unchanged(message)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_request_response_metadata_is_kept_on_a_retained_message(
    bridge: BridgeProcess, qos: int
) -> None:
    with paho5(bridge.port) as publisher:
        publisher.publish("retained-meta/press3", PAYLOAD, qos=qos, retain=True, **METADATA)
        # a live subscriber's copy confirms the retained one is stored before we read it back
        with paho5(bridge.port) as late:
            assert late.subscribe(("retained-meta/#", sub_options(2))) == [2]
            message = late.get()
            assert message.retain is True
            assert_metadata_unchanged(message)


def test_metadata_round_trip_with_mosquitto_pub_and_mosquitto_sub(bridge: BridgeProcess) -> None:
    session = mosquitto_subscribe_session(bridge.port, "mosq-responder", "mosq/requests/#")
    mosquitto_pub(
        bridge.port,
        *("-t", "mosq/requests/7", "-q", "1", "-m", '{"cmd":"stop"}'),
        *("-D", "publish", "response-topic", "mosq/replies/7"),
        *("-D", "publish", "correlation-data", "corr-7"),
        *("-D", "publish", "user-property", "k", "v1"),
        *("-D", "publish", "user-property", "k", "v2"),
        *("-D", "publish", "user-property", "a", "b"),
        *("-D", "publish", "content-type", "application/json"),
        *("-D", "publish", "payload-format-indicator", "1"),
    )
    with mosquitto_sub_process(bridge.port, *session, "-C", "1") as responder:
        (message,) = responder.messages(1)
    assert message["topic"] == "mosq/requests/7"
    assert message["payload"] == '{"cmd":"stop"}'
    props = message["properties"]
    assert props["response-topic"] == "mosq/replies/7"
    assert props["correlation-data"] == "corr-7"
    assert props["content-type"] == "application/json"
    assert props["payload-format-indicator"] == 1
    assert user_property_pairs(message) == [("k", "v1"), ("k", "v2"), ("a", "b")]


def test_payload_not_utf8_though_its_format_indicator_says_so_gets_puback_0x99(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as subscriber, paho5(bridge.port) as publisher:
        assert subscriber.subscribe(("pfi/#", sub_options(1))) == [1]
        reason = publisher.publish("pfi/x", b"\xff\xfe not UTF-8", qos=1, PayloadFormatIndicator=1)
        assert reason == R.PAYLOAD_FORMAT_INVALID
        valid = "valid UTF-8 ✓".encode()
        assert publisher.publish("pfi/x", valid, qos=1, PayloadFormatIndicator=1) == 0
        assert subscriber.get().payload == valid
        subscriber.assert_nothing(0.5)  # the invalid one went nowhere
        assert publisher.disconnects.empty()


def test_payload_not_utf8_though_its_format_indicator_says_so_gets_pubrec_0x99_at_qos2(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    client.connect("pfi-qos2")
    client.send(
        Publish("pfi/x", b"\xc3\x28", 2, packet_id=9, properties={P.PAYLOAD_FORMAT_INDICATOR: 1})
    )
    pubrec = client.recv()
    assert (type(pubrec).__name__, pubrec.packet_id, pubrec.reason_code) == (
        "Pubrec",
        9,
        R.PAYLOAD_FORMAT_INVALID,
    )
    assert client.subscribe_many(Subscription("still/connected", 0)) == [0]


def test_properties_over_the_limit_get_puback_0x97_and_go_nowhere(
    bridge_factory: Any,
) -> None:
    node = bridge_factory("max_message_properties=64")
    with paho5(node.port) as subscriber, paho5(node.port) as publisher:
        assert subscriber.subscribe(("big/#", sub_options(1))) == [1]
        reason = publisher.publish("big/x", b"1", qos=1, UserProperty=[("k", "v" * 100)])
        assert reason == R.QUOTA_EXCEEDED
        assert publisher.publish("big/x", b"2", qos=1, UserProperty=[("k", "v" * 10)]) == 0
        assert subscriber.get().payload == b"2"
        subscriber.assert_nothing(0.5)
    node.wait_for_log("exceed max_message_properties=64")
