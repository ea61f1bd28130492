"""MQTT 5.0 application metadata in its stored form (`bridge.storage.metadata`): what a PUBLISH
carries comes back whole, User Properties in order with repeated (and empty) names, the expiry
counted from the message's timestamp, and the bridge's own keys never taken for a user's."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.properties import PropertyId as P
from bridge.storage import metadata

text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8)


@st.composite
def publish_properties(draw: Any) -> dict[int, Any]:
    props: dict[int, Any] = {}
    if draw(st.booleans()):
        props[P.PAYLOAD_FORMAT_INDICATOR] = 1
    if draw(st.booleans()):
        props[P.MESSAGE_EXPIRY_INTERVAL] = draw(st.integers(1, 10_000))
    for identifier in (P.CONTENT_TYPE, P.RESPONSE_TOPIC):
        if draw(st.booleans()):
            props[identifier] = draw(text)
    if draw(st.booleans()):
        props[P.CORRELATION_DATA] = draw(st.binary(max_size=16))
    users = draw(
        st.lists(st.tuples(st.sampled_from(["", "a", "b", "mqtt.retained-delivery"]), text))
    )
    if users:
        props[P.USER_PROPERTY] = users
    return props


@given(publish_properties())
def test_publish_properties_come_back_whole_and_in_order_before_any_time_passed(props):
    stored = metadata.from_publish(props)
    assert metadata.to_publish(stored, 1_000, 1_000) == props
    # A retained copy queued for one subscriber: the bridge's key wins over a user property
    # of the name earlier versions used for it.
    assert metadata.retained_qos({**stored, metadata.RETAINED_QOS: "1"}) == 1


def test_repeated_user_property_names_even_empty_ones_are_kept_in_order():
    pairs = [("", "1"), ("a", "2"), ("", "3"), ("a", "4"), ("", "5")]
    stored = metadata.from_publish({P.USER_PROPERTY: pairs})
    assert metadata.user_properties(stored) == pairs
    assert all(metadata.is_user_key(key) for key in stored)


def test_the_bridges_own_keys_are_not_user_properties():
    stored = metadata.from_publish({P.USER_PROPERTY: [("unit", "kg")], P.CONTENT_TYPE: "t"})
    stored[metadata.RETAINED_QOS] = "1"
    stored[metadata.SUBSCRIPTION_IDS] = "2"
    assert metadata.user_properties(stored) == [("unit", "kg")]
    assert metadata.retained_qos(stored) == 1


def test_the_expiry_counts_down_from_the_timestamp_and_ends_at_zero():
    stored = metadata.from_publish({P.MESSAGE_EXPIRY_INTERVAL: 10})
    assert metadata.remaining_expiry(stored, 5_000, 5_000) == 10
    assert metadata.remaining_expiry(stored, 5_000, 11_500) == 4  # 3.5 s left: rounded up
    assert metadata.remaining_expiry(stored, 5_000, 14_999) == 1
    assert not metadata.expired(stored, 5_000, 14_999)
    assert metadata.expired(stored, 5_000, 15_000)
    assert metadata.to_publish(stored, 5_000, 11_500) == {P.MESSAGE_EXPIRY_INTERVAL: 4}
    assert metadata.remaining_expiry({}, 0, 10**12) is None
    assert not metadata.expired({}, 0, 10**12)


def test_topic_alias_and_subscription_identifier_belong_to_the_hop_not_the_message():
    assert metadata.from_publish({P.TOPIC_ALIAS: 3, P.SUBSCRIPTION_IDENTIFIER: [4]}) == {}
