"""The node's durable keyed records: their kinds, and the encodings of the messages in them.

The store keeps these as `meta` records (see `bridge.storage.base`); the node owns what they mean.
`docs/design.md` lists what is written when.
"""

from __future__ import annotations

import json
from base64 import b64decode, b64encode

from bridge.storage.base import Message

KIND_SESSION = "session"
"""Persistent session: its subscriptions (JSON)."""
KIND_OFFSETS = "offsets"
"""Persistent session: committed and sent offsets, QoS 2 PUBREL phase (JSON)."""
KIND_RETAINED = "retained"
"""Topic -> retained message."""
KIND_ONLINE = "online"
"""ClientId -> connection record with its will, deleted on a clean end or with the will."""
KIND_QOS2_IN = "q2in"
"""`ClientId NUL packet id` of inbound QoS 2 messages stored and not yet released."""

RETAINED_DELIVERY = "mqtt.retained-delivery"
"""Property of a retained message queued for one subscriber: the QoS it was granted."""


def will_of(online_record: bytes | None) -> Message | None:
    """The will in an `online` record (JSON: peer, at, node, will), None if it has none."""
    if not online_record:
        return None
    try:
        will = json.loads(online_record).get("will")
    except (ValueError, AttributeError):
        return None
    return decode_message(will.encode()) if will else None


def encode_message(message: Message) -> bytes:
    """A message as a small JSON record (retained messages, wills)."""
    return json.dumps(
        {
            "t": message.topic,
            "p": b64encode(message.payload).decode(),
            "q": message.qos,
            "r": message.retain,
            "pub": message.publisher,
            "k": message.key,
            "ts": message.timestamp_ms,
            "n": message.node,
        },
        separators=(",", ":"),
    ).encode()


def decode_message(data: bytes) -> Message:
    """Inverse of `encode_message`."""
    raw = json.loads(data)
    return Message(
        topic=raw["t"],
        payload=b64decode(raw["p"]),
        qos=int(raw["q"]),
        retain=bool(raw["r"]),
        publisher=raw.get("pub", ""),
        key=raw.get("k", ""),
        timestamp_ms=int(raw.get("ts", 0)),
        node=raw.get("n", ""),
    )
