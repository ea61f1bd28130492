"""MQTT 5.0 message metadata as stored: the keys it takes in `Message.properties`.

A stored message carries its 5.0 metadata (Payload Format Indicator, Message Expiry Interval,
Content Type, Response Topic, Correlation Data, User Properties) in `Message.properties`, a
``str -> str`` map every store keeps (the file log's records, RocketMQ message properties, the
cluster's frames, Spark rows). Built here and parsed here:

* the metadata the publisher set travels under keys that start with NUL (``"\\x00ct"``...).
  No MQTT string may contain U+0000 (MQTT-1.5.4-2), so no user property can collide with them;
* User Properties keep their own names, in the publisher's order. A name that repeats is stored
  again as ``name NUL n`` (n = 1, 2, ...), so the list comes back whole;
* the Message Expiry Interval is stored as sent, in seconds; it counts from the message's
  `timestamp_ms` (when the node accepted it). `remaining_expiry` gives what is left, and
  `expired` says when nothing is.

`bridge.storage.rocketmq.mapping` renames these onto readable RocketMQ properties
(`mqtt.response_topic`, `mqtt.user.<name>`, ...), so backends read and write them there.
"""

from __future__ import annotations

import contextlib
from base64 import b64decode, b64encode
from collections.abc import Mapping
from typing import Any, Final

from bridge.mqtt.properties import PropertyId

PAYLOAD_FORMAT: Final = "\x00pf"
"""Payload Format Indicator: "1" for UTF-8 text (left out when 0)."""
EXPIRY: Final = "\x00exp"
"""Message Expiry Interval in seconds, counted from the message's timestamp."""
CONTENT_TYPE: Final = "\x00ct"
RESPONSE_TOPIC: Final = "\x00rt"
CORRELATION_DATA: Final = "\x00cd"
"""Correlation Data, base64."""
SUBSCRIPTION_IDS: Final = "\x00sid"
"""A retained message queued for one subscriber: the Subscription Identifiers it goes with
(comma-separated). The bridge's own, never sent as a property."""
RETAINED_QOS: Final = "\x00rq"
"""A retained message queued for one subscriber (on SUBSCRIBE): the QoS it was granted."""
LEGACY_RETAINED_QOS: Final = "mqtt.retained-delivery"
"""What earlier versions stored as `RETAINED_QOS` (read only when `RETAINED_QOS` is absent)."""

SYSTEM_PREFIX: Final = "\x00"
"""Keys that are not User Properties start with this and a letter (a NUL and a digit is the
repeat of a User Property with an empty name)."""

_P = PropertyId


def from_publish(props: Mapping[int, Any]) -> dict[str, str]:
    """The stored form of a PUBLISH's (or a will's) application metadata. Properties that
    belong to the hop, not the message (Topic Alias, Subscription Identifier), are left out."""
    meta: dict[str, str] = {}
    if not props:
        return meta
    if props.get(_P.PAYLOAD_FORMAT_INDICATOR):
        meta[PAYLOAD_FORMAT] = "1"
    expiry = props.get(_P.MESSAGE_EXPIRY_INTERVAL)
    if expiry is not None:
        meta[EXPIRY] = str(expiry)
    content_type = props.get(_P.CONTENT_TYPE)
    if content_type is not None:
        meta[CONTENT_TYPE] = content_type
    response_topic = props.get(_P.RESPONSE_TOPIC)
    if response_topic is not None:
        meta[RESPONSE_TOPIC] = response_topic
    correlation = props.get(_P.CORRELATION_DATA)
    if correlation is not None:
        meta[CORRELATION_DATA] = b64encode(correlation).decode()
    users = props.get(_P.USER_PROPERTY)
    if users:
        put_user_properties(meta, users)
    return meta


def put_user_properties(meta: dict[str, str], pairs: list[tuple[str, str]]) -> None:
    """Add User Properties to stored metadata, keeping order and repeated names."""
    for name, value in pairs:
        key = name
        n = 0
        while key in meta:
            n += 1
            key = f"{name}\x00{n}"
        meta[key] = value


def user_properties(meta: Mapping[str, str]) -> list[tuple[str, str]]:
    """The User Properties in stored metadata, in their stored order."""
    return [(key.split("\x00", 1)[0], value) for key, value in meta.items() if is_user_key(key)]


def is_user_key(key: str) -> bool:
    """Whether a stored key holds a User Property (its name, or a repeat of it)."""
    return not key.startswith(SYSTEM_PREFIX) or key[1:2].isdigit()


def retained_qos(meta: Mapping[str, str]) -> int | None:
    """The QoS a retained message queued for one subscriber (read from its private queue) was
    granted; None if the message carries none. Copies of earlier versions carry it under
    `LEGACY_RETAINED_QOS`, read only when the current key is absent."""
    text = meta.get(RETAINED_QOS)
    if text is None:
        text = meta.get(LEGACY_RETAINED_QOS)
    return int(text) if text is not None and text.isdigit() else None


def remaining_expiry(meta: Mapping[str, str], timestamp_ms: int, now_ms: int) -> int | None:
    """Seconds left of the message's expiry interval at `now_ms` (None: it never expires; 0:
    it has expired). A message is sent with what is left, at least one second."""
    text = meta.get(EXPIRY)
    if text is None:
        return None
    try:
        interval = int(text)
    except ValueError:
        return None
    left_ms = timestamp_ms + interval * 1000 - now_ms
    if left_ms <= 0:
        return 0
    return max(1, -(-left_ms // 1000))


def expired(meta: Mapping[str, str], timestamp_ms: int, now_ms: int) -> bool:
    """Whether the message's expiry interval has passed (MQTT-3.3.2-5: it is not delivered)."""
    return EXPIRY in meta and remaining_expiry(meta, timestamp_ms, now_ms) == 0


def to_publish(meta: Mapping[str, str], timestamp_ms: int, now_ms: int) -> dict[int, Any]:
    """The PUBLISH properties a v5 subscriber gets for stored metadata (the expiry interval
    reduced by the time the message waited, MQTT-3.3.2-6). Empty for a message without any."""
    props: dict[int, Any] = {}
    if not meta:
        return props
    if meta.get(PAYLOAD_FORMAT) == "1":
        props[_P.PAYLOAD_FORMAT_INDICATOR] = 1
    left = remaining_expiry(meta, timestamp_ms, now_ms)
    if left is not None:
        props[_P.MESSAGE_EXPIRY_INTERVAL] = left
    content_type = meta.get(CONTENT_TYPE)
    if content_type is not None:
        props[_P.CONTENT_TYPE] = content_type
    response_topic = meta.get(RESPONSE_TOPIC)
    if response_topic is not None:
        props[_P.RESPONSE_TOPIC] = response_topic
    correlation = meta.get(CORRELATION_DATA)
    if correlation is not None:
        with contextlib.suppress(ValueError):
            props[_P.CORRELATION_DATA] = b64decode(correlation)
    users = user_properties(meta)
    if users:
        props[_P.USER_PROPERTY] = users
    return props


def metadata_size(props: Mapping[int, Any]) -> int:
    """Bytes of application metadata a PUBLISH (or will) carries: what `max_message_properties`
    limits (User Properties, Content Type, Response Topic, Correlation Data)."""
    size = 0
    for identifier in (_P.CONTENT_TYPE, _P.RESPONSE_TOPIC):
        value = props.get(identifier)
        if value is not None:
            size += len(value.encode())
    correlation = props.get(_P.CORRELATION_DATA)
    if correlation is not None:
        size += len(correlation)
    for name, value in props.get(_P.USER_PROPERTY, ()):
        size += len(name.encode()) + len(value.encode())
    return size
