"""The records the storage contract passes around: a message, a message read back, what one read
returns, and a keyed-record update.

Compiled with mypyc (setup.py): every message's fields are read on the hot path (record
encoding, routing, delivery), and compiled code reads a native class's fields as struct fields
rather than by name. `Message`, `Stored` and `ReadResult` are plain classes, not dataclasses
(`bridge.fields` says why). Being native classes, they check their fields' types when set: a
`payload` must be `bytes` (not a bytearray or memoryview), `retain` a bool. The pure-Python
build does not check.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.fields import Fields


class Message(Fields):
    """An application message as stored: MQTT topic, payload and the MQTT header fields.

    Fields:
    - `publisher`: ClientId of the publisher ("" for messages the bridge makes itself, e.g. the
      wills of a node).
    - `key`: unique message key, node id + counter; backends index it, consumers use it to
      deduplicate.
    - `properties`: MQTT 5.0 properties kept with the message (a new dict if not given).
    """

    FIELDS = (
        "topic",
        "payload",
        "qos",
        "retain",
        "publisher",
        "key",
        "timestamp_ms",
        "node",
        "properties",
    )
    __slots__ = FIELDS

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        publisher: str = "",
        key: str = "",
        timestamp_ms: int = 0,
        node: str = "",
        properties: dict[str, str] | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.publisher = publisher
        self.key = key
        self.timestamp_ms = timestamp_ms
        self.node = node
        self.properties: dict[str, str] = {} if properties is None else properties


class Stored(Fields):
    """A message as read back from a queue.

    Fields:
    - `offset`: the message's offset in the queue it was read from.
    - `seq`: store-wide position of the message: unique, increasing, the same in every queue.
    - `queues`: every queue the message was dispatched to (lets a reader of several queues
      deliver once).
    - `size`: bytes the message occupies (payload + topic), for backlog accounting.
    """

    FIELDS = ("offset", "seq", "message", "queues", "size")
    __slots__ = FIELDS

    def __init__(
        self, offset: int, seq: int, message: Message, queues: tuple[str, ...], size: int = 0
    ) -> None:
        self.offset = offset
        self.seq = seq
        self.message = message
        self.queues = queues
        self.size = size


class ReadResult(Fields):
    """What one `read` returns.

    Fields:
    - `next_offset`: the offset to read from next (after the last message returned, or after
      a gap).
    - `lost`: messages between the requested offset and the first retained one, removed by
      retention.
    """

    FIELDS = ("messages", "next_offset", "lost")
    __slots__ = FIELDS

    def __init__(self, messages: list[Stored], next_offset: int, lost: int = 0) -> None:
        self.messages = messages
        self.next_offset = next_offset
        self.lost = lost


@dataclass(slots=True, frozen=True)
class MetaUpdate:
    """Set (`value` is bytes) or delete (`value` is None) one keyed record of a kind."""

    kind: str
    key: str
    value: bytes | None
