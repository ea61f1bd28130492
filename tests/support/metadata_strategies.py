"""Hypothesis strategies for stored MQTT 5 metadata (`bridge.storage.metadata`), shared by the
round-trip tests of the places it travels through: the RocketMQ mapping, the state records, the
peer frames and the Spark rows.

A metadata dict is built the way the node builds it, from a PUBLISH's properties
(`metadata.from_publish`), so it holds what a real message can hold: repeated User Property
names (stored as `name NUL n`), empty strings, names that look like escapes or like the
RocketMQ property names, and sometimes the bridge's own `RETAINED_QOS`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from bridge.mqtt.properties import PropertyId
from bridge.storage import metadata

mqtt_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=16
)
"""An MQTT UTF-8 string: any character but U+0000 (MQTT-1.5.4-2) and surrogates."""

_tricky_names = st.sampled_from(
    ["a", "b", "", "a,b", "%00", "%25", "x%2Cy", "mqtt.content_type", "ünï", "\x01", ","]
)
user_property = st.tuples(st.one_of(_tricky_names, mqtt_text), mqtt_text)

publish_properties = st.fixed_dictionaries(
    {},
    optional={
        PropertyId.PAYLOAD_FORMAT_INDICATOR: st.integers(0, 1),
        PropertyId.MESSAGE_EXPIRY_INTERVAL: st.integers(0, 2**32 - 1),
        PropertyId.CONTENT_TYPE: mqtt_text,
        PropertyId.RESPONSE_TOPIC: mqtt_text,
        PropertyId.CORRELATION_DATA: st.binary(max_size=24),
        PropertyId.USER_PROPERTY: st.lists(user_property, max_size=6),
    },
)


@st.composite
def stored_metadata(draw: st.DrawFn) -> dict[str, str]:
    """A message's `properties` as the node stores them."""
    meta = metadata.from_publish(draw(publish_properties))
    if draw(st.booleans()) and draw(st.booleans()):
        meta[metadata.RETAINED_QOS] = str(draw(st.integers(0, 2)))
    return meta
