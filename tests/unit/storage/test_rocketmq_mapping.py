"""The MQTT <-> RocketMQ mapping: names stay in RocketMQ's alphabet, never collide, and a
message survives the round trip whoever produced it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bridge.storage import metadata
from bridge.storage.base import Message
from bridge.storage.rocketmq.mapping import (
    DEFAULT_QOS_FOR_BACKEND_MESSAGES,
    MAX_NAME,
    MULTI_DISPATCH,
    NOTIFY_FILTER,
    PROP_NOTIFY_SKIP,
    PROP_USER_ORDER,
    escape_name,
    from_rocketmq,
    lmq_name,
    rocketmq_topic,
    to_rocketmq,
    unescape_name,
)
from tests.support.metadata_strategies import stored_metadata

ROCKETMQ_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
level = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/"), max_size=40)


@given(text)
def test_escape_is_reversible_and_stays_in_the_rocketmq_alphabet(name):
    escaped = escape_name(name)
    assert unescape_name(escaped) == name
    assert escaped == "" or ROCKETMQ_NAME.match(escaped)


@given(level, level)
def test_different_first_levels_never_share_a_rocketmq_topic(a, b):
    topic_a, topic_b = rocketmq_topic(a + "/x"), rocketmq_topic(b + "/y")
    assert ROCKETMQ_NAME.match(topic_a) and len(topic_a) <= MAX_NAME
    assert (topic_a == topic_b) == (a == b)


def test_topic_mapping_examples():
    assert rocketmq_topic("factory/line1/press3") == "factory"
    assert rocketmq_topic("factory") == "factory"
    assert rocketmq_topic("$SYS/broker/load") == "|24SYS"
    assert rocketmq_topic("/starts/with/slash") == "|"
    assert rocketmq_topic("usine.é/x") == "usine|2E|C3|A9"
    # devices cannot write into the broker's own topics
    assert rocketmq_topic("TBW102/x") == "|54BW102"
    assert rocketmq_topic("RMQ_SYS_TRACE_TOPIC/x").startswith("|52")


def test_long_names_are_bounded_and_still_distinct():
    a, b = "a" * 300, "a" * 299 + "b"
    assert len(rocketmq_topic(a)) <= MAX_NAME
    assert rocketmq_topic(a) != rocketmq_topic(b)
    assert len(lmq_name("f:" + "é" * 200)) <= MAX_NAME
    assert lmq_name("f:" + "é" * 200) != lmq_name("f:" + "é" * 199 + "e")


@given(text.filter(bool), text.filter(bool))
def test_lmq_names_are_valid_and_distinct(q1, q2):
    n1, n2 = lmq_name(q1), lmq_name(q2)
    assert n1.startswith("%LMQ%") and ROCKETMQ_NAME.match(n1) and len(n1) <= MAX_NAME
    assert "/" not in n1
    assert (n1 == n2) == (q1 == q2)


@given(
    topic=text.filter(bool),
    payload=st.binary(max_size=100),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=text,
    node=text,
    meta=stored_metadata(),
    data=st.data(),
)
def test_message_round_trips_through_rocketmq_fields_in_any_property_order(
    topic, payload, qos, retain, publisher, node, meta, data
):
    message = Message(
        topic, payload, qos, retain, publisher, "node-1-42", 1700000000123, node, meta
    )
    rmq_topic, tag, keys, properties, body = to_rocketmq(message, ["f:a/#", "c:dev"])
    for value in (tag, *properties, *properties.values()):
        assert value and "\x01" not in value and "\x02" not in value
    assert not any("\x00" in name for name in properties)
    assert properties[MULTI_DISPATCH] == f"{lmq_name('f:a/#')},{lmq_name('c:dev')}"
    # The broker hands the properties back in its hash map's order, not the producer's.
    shuffled = dict(data.draw(st.permutations(list(properties.items()))))
    back = from_rocketmq(tag, keys, shuffled, body)
    assert back == message
    assert metadata.user_properties(back.properties) == metadata.user_properties(meta)
    assert (PROP_USER_ORDER in properties) == (len(metadata.user_properties(meta)) > 1)
    assert rmq_topic == rocketmq_topic(topic)


def test_mqtt5_metadata_travels_as_readable_rocketmq_properties():
    meta = metadata.from_publish(
        {
            0x01: 1,  # Payload Format Indicator
            0x02: 60,  # Message Expiry Interval
            0x03: "application/json",
            0x08: "replies/dev-1",
            0x09: b"\x00\x01req-7",
            0x26: [("unit", "kg"), ("tag", "a"), ("tag", "b"), ("rate", "50%")],
        }
    )
    _topic, _tag, _keys, props, _body = to_rocketmq(Message("a/b", b"x", properties=meta), ())
    assert {k: v for k, v in props.items() if k.startswith("mqtt.") and k != "mqtt.ts"} == {
        "mqtt.qos": "0",
        "mqtt.retain": "0",
        "mqtt.payload_format": "1",
        "mqtt.message_expiry": "60",
        "mqtt.content_type": "application/json",
        "mqtt.response_topic": "replies/dev-1",
        "mqtt.correlation_data": "AAFyZXEtNw==",
        "mqtt.user.unit": "kg",
        "mqtt.user.tag": "a",
        "mqtt.user.tag%001": "b",
        "mqtt.user.rate": "50%25",
        "mqtt.user_order": "unit,tag,tag%001,rate",
    }


def test_a_backend_writing_the_rocketmq_properties_reaches_devices_with_that_metadata():
    """What a backend produces for devices, in whatever order, becomes the stored metadata a
    PUBLISH is built from; one user property needs no order."""
    props = {
        "mqtt.user.b": "2",
        "mqtt.response_topic": "svc/replies",
        "mqtt.user_order": "a,b,a%001",
        "mqtt.user.a%001": "3",
        "mqtt.correlation_data": "cmVxLTE=",
        "mqtt.user.a": "1",
        "mqtt.content_type": "text/plain",
        "mqtt.message_expiry": "30",
        "mqtt.payload_format": "1",
    }
    message = from_rocketmq("dev/1/cmd", "k", props, b"on", store_timestamp_ms=5000)
    assert message is not None
    assert metadata.user_properties(message.properties) == [("a", "1"), ("b", "2"), ("a", "3")]
    assert metadata.to_publish(message.properties, message.timestamp_ms, 15000) == {
        0x01: 1,
        0x02: 20,  # counted from the store time: the backend left mqtt.ts out
        0x03: "text/plain",
        0x08: "svc/replies",
        0x09: b"req-1",
        0x26: [("a", "1"), ("b", "2"), ("a", "3")],
    }
    single = from_rocketmq("dev/1/cmd", "k", {"mqtt.user.only": "v"}, b"on")
    assert single is not None and single.properties == {"only": "v"}


def test_user_properties_missing_from_the_order_come_after_the_listed_ones():
    props = {"mqtt.user.z": "late", "mqtt.user.b": "2", "mqtt.user.a": "1"}
    message = from_rocketmq("t", "k", {**props, PROP_USER_ORDER: "a,b,gone"}, b"x")
    assert message is not None
    assert list(message.properties.items()) == [("a", "1"), ("b", "2"), ("z", "late")]


def test_the_bridges_own_keys_round_trip_and_the_legacy_retained_qos_is_still_read():
    meta = {metadata.RETAINED_QOS: "1", metadata.SUBSCRIPTION_IDS: "3,4", "unit": "kg"}
    _topic, tag, keys, props, body = to_rocketmq(Message("a/b", b"x", properties=meta), ())
    assert props["mqtt.user.%00rq"] == "1"
    assert PROP_USER_ORDER not in props  # one user property: nothing to order
    back = from_rocketmq(tag, keys, props, body)
    assert back is not None and back.properties == meta
    assert metadata.user_properties(back.properties) == [("unit", "kg")]
    legacy = from_rocketmq(tag, keys, {"mqtt.user.mqtt.retained-delivery": "2"}, body)
    assert legacy is not None and metadata.retained_qos(legacy.properties) == 2


def test_a_message_produced_by_a_backend_reaches_mqtt_at_qos_1():
    message = from_rocketmq(
        "pay/store/42/order/9", None, {}, b'{"paid":true}', msg_id="AC1100", store_timestamp_ms=7
    )
    assert message is not None
    assert (message.topic, message.qos, message.retain) == ("pay/store/42/order/9", 1, False)
    assert DEFAULT_QOS_FOR_BACKEND_MESSAGES == 1
    assert (message.key, message.timestamp_ms, message.publisher) == ("AC1100", 7, "")


def test_a_message_without_tag_has_no_mqtt_topic():
    assert from_rocketmq(None, "k", {}, b"x") is None
    assert from_rocketmq("", "k", {}, b"x") is None


def test_every_bridge_message_is_marked_for_notify_to_leave_and_the_mark_stays_internal():
    _topic, _tag, _keys, props, _body = to_rocketmq(Message("a/b", b"x", node="n1"), ["f:a/#"])
    assert NOTIFY_FILTER == "mqtt_notify_skip IS NULL"
    # Readable by RocketMQ's SQL92 grammar (no dot), and never an MQTT user property of the
    # message read back.
    assert "." not in PROP_NOTIFY_SKIP
    message = from_rocketmq("a/b", "k1", {**props, PROP_NOTIFY_SKIP: "n1"}, b"x")
    assert message is not None and message.properties == {}
