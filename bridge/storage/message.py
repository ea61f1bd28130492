"""The records the storage contract passes around: a message, a message read back, what one read
returns, and a keyed-record update.

Compiled with mypyc (setup.py): every message's fields are read on the hot path (record
encoding, routing, delivery), and compiled code reads a native class's fields as struct fields
rather than by name. `Message` and `Stored` are plain classes, not dataclasses: mypyc gives a
dataclass the `__init__` the dataclasses module writes, which runs as interpreted Python, once
per message. Being native classes, they check their fields' types when set: a `payload` must be
`bytes` (not a bytearray or memoryview), `retain` a bool. The pure-Python build does not check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Message:
    """An application message as stored: MQTT topic, payload and the MQTT header fields.

    Fields:
    - `publisher`: ClientId of the publisher ("" for messages the bridge makes itself, e.g. the
      wills of a node).
    - `key`: unique message key, node id + counter; backends index it, consumers use it to
      deduplicate.
    - `properties`: MQTT 5.0 properties kept with the message (a new dict if not given).
    """

    __slots__ = (
        "key",
        "node",
        "payload",
        "properties",
        "publisher",
        "qos",
        "retain",
        "timestamp_ms",
        "topic",
    )

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

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.topic,
            self.payload,
            self.qos,
            self.retain,
            self.publisher,
            self.key,
            self.timestamp_ms,
            self.node,
            self.properties,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, payload={self.payload!r}, qos={self.qos!r}, "
            f"retain={self.retain!r}, publisher={self.publisher!r}, key={self.key!r}, "
            f"timestamp_ms={self.timestamp_ms!r}, node={self.node!r}, "
            f"properties={self.properties!r})"
        )


class Stored:
    """A message as read back from a queue.

    Fields:
    - `offset`: the message's offset in the queue it was read from.
    - `seq`: store-wide position of the message: unique, increasing, the same in every queue.
    - `queues`: every queue the message was dispatched to (lets a reader of several queues
      deliver once).
    - `size`: bytes the message occupies (payload + topic), for backlog accounting.
    """

    __slots__ = ("message", "offset", "queues", "seq", "size")

    def __init__(
        self, offset: int, seq: int, message: Message, queues: tuple[str, ...], size: int = 0
    ) -> None:
        self.offset = offset
        self.seq = seq
        self.message = message
        self.queues = queues
        self.size = size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stored):
            return NotImplemented
        return (self.offset, self.seq, self.message, self.queues, self.size) == (
            other.offset,
            other.seq,
            other.message,
            other.queues,
            other.size,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (
            f"Stored(offset={self.offset!r}, seq={self.seq!r}, message={self.message!r}, "
            f"queues={self.queues!r}, size={self.size!r})"
        )


@dataclass(slots=True)
class ReadResult:
    """What one `read` returns."""

    messages: list[Stored]
    next_offset: int
    """The offset to read from next (after the last message returned, or after a gap)."""
    lost: int = 0
    """Messages between the requested offset and the first retained one, removed by retention."""


@dataclass(slots=True, frozen=True)
class MetaUpdate:
    """Set (`value` is bytes) or delete (`value` is None) one keyed record of a kind."""

    kind: str
    key: str
    value: bytes | None
