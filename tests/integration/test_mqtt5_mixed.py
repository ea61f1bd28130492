"""MQTT 3.1.1 and 5.0 clients on one real bridge node: a 3.1.1 publisher reaches a v5
subscriber and a v5 publisher (with properties) reaches a 3.1.1 subscriber, which gets the
message and no properties, at each QoS; with paho-mqtt on both ends, and with mosquitto_pub /
mosquitto_sub as a user mixing `-V 311` and `-V 5` would run them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bridge.mqtt.packets import Publish
from tests.support.clients import RawClient, paho_client
from tests.support.mqtt5 import (
    mosquitto_pub,
    mosquitto_sub_process,
    mosquitto_subscribe_session,
    paho5,
    sub_options,
)
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

METADATA: dict[str, Any] = {
    "ResponseTopic": "mixed/replies",
    "CorrelationData": b"corr",
    "UserProperty": [("k", "v"), ("k", "w")],
    "ContentType": "text/plain",
    "PayloadFormatIndicator": 1,
    "MessageExpiryInterval": 120,
}


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_3_1_1_publisher_reaches_a_v5_subscriber(bridge: BridgeProcess, qos: int) -> None:
    with paho5(bridge.port) as subscriber, paho_client(bridge.port) as old:
        assert subscriber.subscribe(("mixed/up/#", sub_options(2))) == [2]
        old.client.publish("mixed/up/x", b"from 3.1.1", qos=qos).wait_for_publish(5)
        message = subscriber.get()
        assert (message.topic, message.payload, message.qos) == ("mixed/up/x", b"from 3.1.1", qos)
        assert not hasattr(message.properties, "UserProperty")
        assert not hasattr(message.properties, "MessageExpiryInterval")


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_v5_publisher_with_properties_reaches_a_3_1_1_subscriber_without_them(
    bridge: BridgeProcess, qos: int
) -> None:
    with paho_client(bridge.port) as old, paho5(bridge.port) as publisher:
        subscribed = threading.Event()
        old.client.on_subscribe = lambda *_args: subscribed.set()
        old.client.subscribe("mixed/down/#", 2)
        assert subscribed.wait(5), "no SUBACK for the 3.1.1 subscriber"
        # a 3.1.1 raw reader checks the wire: a v5 property block would not decode at level 4
        wire = RawClient(bridge.port)
        wire.connect("wire-311")
        assert wire.subscribe("mixed/down/#", 2) == [2]
        publisher.publish("mixed/down/x", b"from v5", qos=qos, **METADATA)
        message = old.get()
        assert (message.topic, message.payload, message.qos) == ("mixed/down/x", b"from v5", qos)
        on_wire = wire.recv()
        assert isinstance(on_wire, Publish)
        assert (on_wire.topic, on_wire.payload, on_wire.qos) == ("mixed/down/x", b"from v5", qos)
        assert on_wire.properties == {}


@pytest.mark.parametrize("qos", [1, 2])
def test_mosquitto_pub_3_1_1_reaches_mosquitto_sub_5(bridge: BridgeProcess, qos: int) -> None:
    session = mosquitto_subscribe_session(bridge.port, "mosq-v5", "mosq/mixed/#", qos)
    mosquitto_pub(bridge.port, "-t", "mosq/mixed/a", "-q", str(qos), "-m", "hi", version="311")
    with mosquitto_sub_process(bridge.port, *session, "-C", "1") as reader:
        (message,) = reader.messages(1)
    assert (message["topic"], message["payload"], message["qos"]) == ("mosq/mixed/a", "hi", qos)
    assert not message.get("properties")


@pytest.mark.parametrize("qos", [1, 2])
def test_mosquitto_pub_5_with_properties_reaches_mosquitto_sub_3_1_1(
    bridge: BridgeProcess, qos: int
) -> None:
    session = mosquitto_subscribe_session(
        bridge.port, "mosq-311", "mosq/mixed/#", qos, version="311"
    )
    mosquitto_pub(
        bridge.port,
        *("-t", "mosq/mixed/b", "-q", str(qos), "-m", "from v5"),
        *("-D", "publish", "user-property", "k", "v"),
        *("-D", "publish", "content-type", "text/plain"),
        *("-D", "publish", "response-topic", "mosq/replies"),
        *("-D", "publish", "message-expiry-interval", "120"),
    )
    with mosquitto_sub_process(bridge.port, *session, "-C", "1", version="311") as reader:
        (message,) = reader.messages(1)
    assert (message["topic"], message["payload"], message["qos"]) == (
        "mosq/mixed/b",
        "from v5",
        qos,
    )
    assert not message.get("properties")
