"""How MQTT messages map onto RocketMQ: topic, tag, keys, properties, light queues.

Pure functions, no I/O. Spark jobs and backends that produce straight into RocketMQ depend on
this mapping; docs/design.md has it as a table. In short:

* RocketMQ topic = the first level of the MQTT topic, escaped into RocketMQ's topic alphabet
  (`rocketmq_topic`);
* tag = the full MQTT topic, so a reader can filter on the broker;
* KEYS = the bridge's unique message key (the broker indexes it);
* properties `mqtt.qos`, `mqtt.retain`, `mqtt.publisher`, `mqtt.node` carry the MQTT header fields;
  `mqtt_notify_skip` tells notify that the storing bridge announced it (`NOTIFY_FILTER`);
* the MQTT 5 metadata (`bridge.storage.metadata`) becomes readable properties, the same whoever
  writes them (a bridge, or a backend producing a message for devices):

  ====================== =========================== ===========================================
  metadata               RocketMQ property           value
  ====================== =========================== ===========================================
  Payload Format         `mqtt.payload_format`       "1": the payload is UTF-8 text
  Message Expiry         `mqtt.message_expiry`       seconds, counted from `mqtt.ts` (or the
                                                     store time when a backend left `mqtt.ts`
                                                     out)
  Content Type           `mqtt.content_type`         as published
  Response Topic         `mqtt.response_topic`       as published
  Correlation Data       `mqtt.correlation_data`     base64 of the bytes
  User Property n = v    `mqtt.user.n` = v           a name that repeats: `mqtt.user.n%001`,
                                                     `mqtt.user.n%002`, ... (the stored form
                                                     `n NUL k`, its NUL escaped as `%00`)
  order of the User      `mqtt.user_order`           only with 2 or more: their names as in the
  Properties                                         property names, `,`-separated (a `,` in a
                                                     name as `%2C`)
  ====================== =========================== ===========================================

  The broker keeps a message's properties in a hash map and writes them back in its order, not
  the producer's (a test against a real broker shows it), so the order MQTT requires of User
  Properties (MQTT-3.3.2-18) travels in `mqtt.user_order`. A reader puts the names it lists
  first, in that order, and any other user properties after them. The bridge's own keys
  (a retained message queued for one subscriber: its granted QoS and Subscription
  Identifiers) travel as `mqtt.user.%00rq`, `mqtt.user.%00sid` (earlier versions wrote the QoS
  as `mqtt.user.mqtt.retained-delivery`, still read);
* body = the payload;
* the queues a message is dispatched to (one per matching filter, ...) become light message queues
  (LMQ) named by `lmq_name`, listed in `INNER_MULTI_DISPATCH`.

Escaping: RocketMQ names may hold only `a-z A-Z 0-9 _ - | %` and at most 127 characters. Every
other UTF-8 byte, and `|` and `%` themselves, become `|XX` (two upper-case hex digits), so the
escape is reversible and two different MQTT names never share a RocketMQ name. A name that would
be longer than the limit keeps a readable prefix and ends in `|H` + 20 hex digits of its SHA-256.
Property values (the tag, the metadata, user property names and values) are percent-escaped:
`%`, and RocketMQ's separators `\\x01` and `\\x02`, become `%25`, `%01`, `%02` (and NUL in a
property name `%00`); an empty value, which the broker would drop, is sent as `%00`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final

from bridge.storage import metadata
from bridge.storage.base import Message
from bridge.storage.rocketmq.messages import (
    LMQ_DISPATCH_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    StoredMessage,
)

MAX_NAME: Final = 127
"""RocketMQ's limit on topic names (LMQ names are topic names too)."""

# The broker's own names, defined once with the wire format.
MULTI_DISPATCH: Final = PROPERTY_INNER_MULTI_DISPATCH
MULTI_QUEUE_OFFSET: Final = PROPERTY_INNER_MULTI_QUEUE_OFFSET

PROP_QOS: Final = "mqtt.qos"
PROP_RETAIN: Final = "mqtt.retain"
PROP_PUBLISHER: Final = "mqtt.publisher"
PROP_NODE: Final = "mqtt.node"
PROP_TIMESTAMP: Final = "mqtt.ts"
PROP_EMPTY: Final = "mqtt.empty"
"""Set to "1" when the MQTT payload is empty: RocketMQ refuses an empty body, so such a message
carries the one-byte body `EMPTY_BODY`, which readers must ignore."""
EMPTY_BODY: Final = b"\x00"
PROP_NOTIFY_SKIP: Final = "mqtt_notify_skip"
"""Set (to the storing node's id) on every message a bridge stores: that bridge wakes the
message's readers itself, so notify has nothing to do for it (`NOTIFY_FILTER`). Spelled with
underscores: RocketMQ's SQL92 filter cannot name a property with a dot."""
NOTIFY_FILTER: Final = f"{PROP_NOTIFY_SKIP} IS NULL"
"""The SQL92 filter of notify's pulls: only messages no bridge announced (backends', notify's own
dispatched copies, bridges of earlier versions)."""
PROP_DELAYED: Final = "mqtt.delayed"
"""On a delayed publish (`$delayed/<seconds>/<topic>`): the delay in seconds. Such a message is
sent as a RocketMQ timer message (`TIMER_DELIVER_MS`) without `mqtt.node` and without
`mqtt_notify_skip`: when the broker puts it into its topic at the due time, notify reads it and
routes it like a backend's message, once per cluster, whatever version the notifier is."""
TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
"""The broker's timer property (RocketMQ 5.x, `timerWheelEnable`): deliver at this epoch ms."""
TIMER_TOPIC: Final = "rmq_sys_wheel_timer"
"""Where the broker keeps a timer message (and indexes its key) until it is due."""
TIMER_PRECISION_MS: Final = 1000
"""The broker's default `timerPrecisionMs`; a due time it is given is rounded down to it."""


def timer_deliver_ms(due_ms: int) -> int:
    """The `TIMER_DELIVER_MS` that makes the broker deliver at `due_ms` or just after, never
    before: it rounds a time down to its precision (a whole multiple: one step down), so ask
    for 1 ms past the next whole step (with a finer precision that divides 1000 ms this rounds
    down to the same step)."""
    return -(-due_ms // TIMER_PRECISION_MS) * TIMER_PRECISION_MS + 1


USER_PREFIX: Final = "mqtt.user."
"""Message.properties (MQTT 5 user properties) travel as `mqtt.user.<name>`."""
PROP_USER_ORDER: Final = "mqtt.user_order"
"""The order of a message's User Properties, when it has two or more (the broker does not keep
the order of properties): their escaped names, `,`-separated, a `,` in a name as `%2C`."""
PROP_PAYLOAD_FORMAT: Final = "mqtt.payload_format"
PROP_MESSAGE_EXPIRY: Final = "mqtt.message_expiry"
PROP_CONTENT_TYPE: Final = "mqtt.content_type"
PROP_RESPONSE_TOPIC: Final = "mqtt.response_topic"
PROP_CORRELATION_DATA: Final = "mqtt.correlation_data"
METADATA_PROPERTIES: Final[Mapping[str, str]] = {
    metadata.PAYLOAD_FORMAT: PROP_PAYLOAD_FORMAT,
    metadata.EXPIRY: PROP_MESSAGE_EXPIRY,
    metadata.CONTENT_TYPE: PROP_CONTENT_TYPE,
    metadata.RESPONSE_TOPIC: PROP_RESPONSE_TOPIC,
    metadata.CORRELATION_DATA: PROP_CORRELATION_DATA,
}
"""Stored MQTT 5 metadata key (`bridge.storage.metadata`) -> the RocketMQ property carrying it
(the Spark source's columns are these names without `mqtt.`)."""
_METADATA_KEYS: Final = {prop: key for key, prop in METADATA_PROPERTIES.items()}

DEFAULT_QOS_FOR_BACKEND_MESSAGES: Final = 1
"""A message produced into RocketMQ without `mqtt.qos` (a backend, not a bridge) is delivered at
QoS 1: it is stored, so it can be delivered reliably; subscriptions cap it as usual."""

_PLAIN: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_RESERVED_TOPICS: Final = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "DefaultCluster",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    }
)
_RESERVED_PREFIXES: Final = ("RMQ_SYS_", "rmq_sys_", "CID_RMQ_SYS_")
_HASH_DIGITS: Final = 20


def escape_name(text: str) -> str:
    """`text` in RocketMQ's name alphabet, reversibly (see the module docstring)."""
    out = []
    for byte in text.encode("utf-8"):
        if byte in _PLAIN:
            out.append(chr(byte))
        else:
            out.append(f"|{byte:02X}")
    return "".join(out)


def unescape_name(name: str) -> str:
    """Inverse of `escape_name` (raises ValueError for a name it cannot have produced)."""
    data = bytearray()
    i = 0
    while i < len(name):
        char = name[i]
        if char == "|":
            digits = name[i + 1 : i + 3]
            if len(digits) != 2 or digits.upper() != digits:
                raise ValueError(f"bad escape at {i} in {name!r}")
            data.append(int(digits, 16))
            i += 3
        else:
            if ord(char) > 127 or ord(char) not in _PLAIN:
                raise ValueError(f"character {char!r} cannot appear in an escaped name")
            data.append(ord(char))
            i += 1
    return data.decode("utf-8")


def _bounded(escaped: str, original: str, limit: int) -> str:
    if len(escaped) <= limit:
        return escaped
    digest = hashlib.sha256(original.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    keep = limit - 2 - _HASH_DIGITS
    prefix = escaped[:keep]
    # Do not cut an escape in half: a dangling `|X` would read as a different escape.
    cut = prefix.rfind("|", max(0, keep - 2))
    if cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}|H{digest}"  # `|H` is no escape (H is not a hex digit)


def rocketmq_topic(mqtt_topic: str) -> str:
    """The RocketMQ topic of an MQTT topic name: its first level, escaped.

    `factory/line1/press3` -> `factory`; `$SYS/broker/x` -> `|24SYS`; `/a` (empty first level)
    -> `|` (no other name is a lone bar). System topic names are escaped one character more
    (`TBW102` -> `|54BW102`) so devices cannot write into the broker's own topics.
    """
    first = mqtt_topic.split("/", 1)[0]
    if not first:
        return "|"
    escaped = escape_name(first)
    if escaped in _RESERVED_TOPICS or escaped.startswith(_RESERVED_PREFIXES):
        escaped = f"|{ord(escaped[0]):02X}{escaped[1:]}"
    return _bounded(escaped, first, MAX_NAME)


def lmq_name(queue: str) -> str:
    """The light message queue (a RocketMQ topic named `%LMQ%...`) holding a bridge queue."""
    return LMQ_PREFIX + _bounded(escape_name(queue), queue, MAX_NAME - len(LMQ_PREFIX))


EMPTY_VALUE: Final = "%00"
"""RocketMQ refuses empty property values: an empty MQTT 5 user property name or value (or an
empty content type, ...) travels as this (escaping never produces it otherwise: a lone NUL, which
a user property name would escape to it, is no stored key)."""


def _escape_value(value: str) -> str:
    # Property values are joined with \x01 and \x02; keep those (and the escape) out.
    return value.replace("%", "%25").replace("\x01", "%01").replace("\x02", "%02")


def _unescape_value(value: str) -> str:
    if value == EMPTY_VALUE:
        return ""
    return value.replace("%01", "\x01").replace("%02", "\x02").replace("%25", "%")


def _escape_user_name(name: str) -> str:
    # A repeated User Property is stored as `name NUL n`: its NUL travels as `%00` (escaping
    # `%` first leaves every `%` the start of an escape, so `%00` inside a name is never
    # ambiguous; alone it is the empty name, `EMPTY_VALUE`).
    return _escape_value(name).replace("\x00", "%00") or EMPTY_VALUE


def _unescape_user_name(name: str) -> str:
    if name == EMPTY_VALUE:
        return ""
    return _unescape_value(name.replace("%00", "\x00"))


def _order_item(escaped_name: str) -> str:
    return escaped_name.replace(",", "%2C")


def tag_of(mqtt_topic: str) -> str:
    """The TAGS value of messages published to `mqtt_topic` (readers filter on it)."""
    return _escape_value(mqtt_topic) or EMPTY_VALUE


def to_rocketmq(
    message: Message, queues: Sequence[str]
) -> tuple[str, str, str, dict[str, str], bytes]:
    """(RocketMQ topic, tag, keys, properties, body) of a message dispatched to `queues`."""
    properties = {
        PROP_QOS: str(message.qos),
        PROP_RETAIN: "1" if message.retain else "0",
        PROP_TIMESTAMP: str(message.timestamp_ms),
    }
    # Empty values are left out (RocketMQ refuses them); a reader defaults them to "".
    if message.publisher:
        properties[PROP_PUBLISHER] = _escape_value(message.publisher)
    if message.node:
        properties[PROP_NODE] = _escape_value(message.node)
    if message.properties:
        _put_metadata(properties, message.properties)
    if queues:
        properties[MULTI_DISPATCH] = LMQ_DISPATCH_SEPARATOR.join(lmq_name(q) for q in queues)
    body = message.payload
    if not body:
        properties[PROP_EMPTY] = "1"
        body = EMPTY_BODY
    return rocketmq_topic(message.topic), tag_of(message.topic), message.key, properties, body


def _put_metadata(properties: dict[str, str], meta: Mapping[str, str]) -> None:
    """The RocketMQ properties of a message's stored metadata (see the module docstring)."""
    order: list[str] = []
    for key, value in meta.items():
        name = METADATA_PROPERTIES.get(key)
        if name is None:
            escaped = _escape_user_name(key)
            name = USER_PREFIX + escaped
            if metadata.is_user_key(key):
                order.append(_order_item(escaped))
        properties[name] = _escape_value(value) or EMPTY_VALUE
    if len(order) > 1:
        properties[PROP_USER_ORDER] = ",".join(order)


def _metadata_of(properties: Mapping[str, str]) -> dict[str, str]:
    """Inverse of `_put_metadata`, whatever order the broker gave the properties in."""
    meta: dict[str, str] = {}
    users: list[tuple[str, str]] = []
    for name, value in properties.items():
        key = _METADATA_KEYS.get(name)
        if key is not None:
            meta[key] = _unescape_value(value)
        elif name.startswith(USER_PREFIX):
            users.append((name[len(USER_PREFIX) :], value))
    order = properties.get(PROP_USER_ORDER)
    if order and len(users) > 1:
        rank = {item: i for i, item in enumerate(order.split(","))}
        users.sort(key=lambda user: rank.get(_order_item(user[0]), len(rank)))
    for escaped, value in users:
        meta[_unescape_user_name(escaped)] = _unescape_value(value)
    return meta


def from_rocketmq(
    tags: str | None,
    keys: str | None,
    properties: Mapping[str, str],
    body: bytes,
    *,
    msg_id: str = "",
    store_timestamp_ms: int = 0,
) -> Message | None:
    """The MQTT message of a RocketMQ message, whoever produced it; None if it has no MQTT
    topic (no tag), so it cannot reach any subscriber."""
    if not tags:
        return None
    topic = _unescape_value(tags)
    qos_text = properties.get(PROP_QOS)
    qos = int(qos_text) if qos_text in ("0", "1", "2") else DEFAULT_QOS_FOR_BACKEND_MESSAGES
    timestamp_text = properties.get(PROP_TIMESTAMP, "")
    return Message(
        topic=topic,
        payload=b"" if properties.get(PROP_EMPTY) == "1" else body,
        qos=qos,
        retain=properties.get(PROP_RETAIN) == "1",
        publisher=_unescape_value(properties.get(PROP_PUBLISHER, "")),
        key=(keys or msg_id).split(" ")[0],
        timestamp_ms=int(timestamp_text) if timestamp_text.isdigit() else store_timestamp_ms,
        node=_unescape_value(properties.get(PROP_NODE, "")),
        properties=_metadata_of(properties),
    )


def message_of(raw: StoredMessage) -> Message | None:
    """The MQTT message of a message pulled from the broker (see `from_rocketmq`)."""
    properties = raw.properties
    return from_rocketmq(
        properties.get(PROPERTY_TAGS),
        properties.get(PROPERTY_KEYS),
        properties,
        raw.body,
        msg_id=raw.msg_id,
        store_timestamp_ms=raw.store_timestamp,
    )
