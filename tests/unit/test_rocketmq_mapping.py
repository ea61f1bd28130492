"""The MQTT <-> RocketMQ mapping: names stay in RocketMQ's alphabet, never collide, and a
message survives the round trip whoever produced it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.base import Message
from bridge.storage.rocketmq.mapping import (
    DEFAULT_QOS_FOR_BACKEND_MESSAGES,
    MAX_NAME,
    MULTI_DISPATCH,
    NOTIFY_FILTER,
    PROP_NOTIFY_SKIP,
    escape_name,
    from_rocketmq,
    lmq_name,
    rocketmq_topic,
    to_rocketmq,
    unescape_name,
)

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
    user=st.dictionaries(text, text, max_size=3),
)
def test_message_round_trips_through_rocketmq_fields(
    topic, payload, qos, retain, publisher, node, user
):
    message = Message(
        topic, payload, qos, retain, publisher, "node-1-42", 1700000000123, node, user
    )
    rmq_topic, tag, keys, properties, body = to_rocketmq(message, ["f:a/#", "c:dev"])
    for value in (tag, *properties, *properties.values()):
        assert "\x01" not in value and "\x02" not in value
    assert properties[MULTI_DISPATCH] == f"{lmq_name('f:a/#')},{lmq_name('c:dev')}"
    back = from_rocketmq(tag, keys, properties, body)
    assert back == message
    assert rmq_topic == rocketmq_topic(topic)


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
