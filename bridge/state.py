"""The node's durable keyed records: their kinds, and the encodings of the messages in them.

The store keeps these as `meta` records (see `bridge.storage.base`); the node owns what they mean.
`docs/design.md` lists what is written when.
"""

from __future__ import annotations

import json
from base64 import b64decode, b64encode
from dataclasses import dataclass

from bridge.storage.base import Message
from bridge.storage.metadata import RETAINED_QOS

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
KIND_DELAYED = "delayed"
"""Message key -> a delayed publish waiting for its due time (embedded store only): a
`DelayedEntry` naming where the message waits on disk (`bridge.node.delayed`). Records of
earlier versions hold the whole message instead, as `encode_message` writes it, its timestamp
the due time."""

RETAINED_DELIVERY = RETAINED_QOS
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


def session_filters(subs: str | bytes) -> set[str]:
    """The (non-shared) filters of a persistent session's subscriptions record (`session`)."""
    return set(json.loads(subs).get("subs", {}))


def encode_message(message: Message) -> bytes:
    """A message as a small JSON record (retained messages, wills; a peer gets a retained
    message in this form too). Its MQTT 5 metadata (`Message.properties`, see
    `bridge.storage.metadata`) is the object `pr`, in its order, left out when empty: records of
    earlier versions have none, and they ignore it."""
    record = {
        "t": message.topic,
        "p": b64encode(message.payload).decode(),
        "q": message.qos,
        "r": message.retain,
        "pub": message.publisher,
        "k": message.key,
        "ts": message.timestamp_ms,
        "n": message.node,
    }
    if message.properties:
        record["pr"] = message.properties
    return json.dumps(record, separators=(",", ":")).encode()


def decode_message(data: bytes) -> Message:
    """Inverse of `encode_message` (also of the records earlier versions wrote)."""
    raw = json.loads(data)
    properties = raw.get("pr") or {}
    return Message(
        topic=raw["t"],
        payload=b64decode(raw["p"]),
        qos=int(raw["q"]),
        retain=bool(raw["r"]),
        publisher=raw.get("pub", ""),
        key=raw.get("k", ""),
        timestamp_ms=int(raw.get("ts", 0)),
        node=raw.get("n", ""),
        properties={str(name): str(value) for name, value in properties.items()},
    )


@dataclass(slots=True, frozen=True)
class Unsettled:
    """An inbound QoS 2 message whose store is not confirmed either way (non-atomic stores)."""

    topic: str
    key: str

    def encode(self) -> bytes:
        """The marker's stored form (JSON of topic and key)."""
        return json.dumps({"t": self.topic, "k": self.key}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Unsettled | None:
        """The marker's message; None for an old marker with no message (taken as stored)."""
        try:
            raw = json.loads(data)
            return cls(str(raw["t"]), str(raw["k"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(slots=True, frozen=True)
class DelayedEntry:
    """A delayed publish waiting on the embedded store: its index record (kind `delayed`, under
    the message key). The message itself, as it arrived (under its `$delayed/...` topic), is on
    the store's delayed queue at `offset`; only this small record is kept in memory."""

    due_ms: int
    """When it is routed (ms since the epoch): the delivered message's timestamp."""
    offset: int
    """Its offset on the delayed queue (`bridge.router.queues.DELAYED_QUEUE`)."""
    publisher: str
    size: int
    """Bytes of payload and target topic: what it counts against the delayed quotas."""

    def encode(self) -> bytes:
        """The record's stored form (JSON)."""
        record = {"due": self.due_ms, "o": self.offset, "pub": self.publisher, "s": self.size}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> DelayedEntry | Message:
        """The entry; for a record of an earlier version, the whole message it holds (its
        timestamp the due time). ValueError, KeyError or TypeError if it is unreadable."""
        raw = json.loads(data)
        if "o" not in raw:
            return decode_message(data)
        return cls(int(raw["due"]), int(raw["o"]), str(raw["pub"]), int(raw["s"]))
