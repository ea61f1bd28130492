"""Retained messages: the last message of each topic that asked to be kept (MQTT-3.3.1-5).

The map is read everywhere (SUBSCRIBE, the admin API, statistics) and changed in one place: a
retained message is written to the store as a meta record in the same append as the message, and
the map changes, and peers are told, only once the store has confirmed that append. So a retained
value anyone can see is a durable one, and a failed write leaves the previous value in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from bridge.mqtt.topics import topic_matches
from bridge.node.quotas import Quota, Tally, kept_size
from bridge.state import KIND_RETAINED, decode_message, encode_message
from bridge.storage.base import Message, MetaUpdate

SYS_PREFIX = "$SYS/"


class RetainedMessages(Mapping[str, Message]):
    """Topic -> retained message, read-only to everyone but the node's publish path."""

    __slots__ = ("_messages", "announce", "quota", "tally")

    def __init__(self, quota: Quota | None = None) -> None:
        self._messages: dict[str, Message] = {}
        self.announce: Callable[[str, bytes], None] | None = None
        """Tells peers a topic's retained message changed (set when the node joins a cluster)."""
        self.quota = quota or Quota()
        """The retained limits (`retained_max_*`; none when not given)."""
        self.tally = Tally()
        """Count and bytes of the retained messages kept, in total and per publisher (not
        `$SYS`, which is the node's own)."""

    def fault_setting(self, topic: str, publisher: str, payload: bytes) -> str | None:
        """Whether `publisher` may set `topic`'s retained message to `payload` (a non-empty
        one; clearing is always allowed): a sentence naming the limit it would pass, or None."""
        return self.tally.fault_adding(topic, publisher, kept_size(topic, payload), self.quota)

    def _keep(self, message: Message) -> None:
        self._messages[message.topic] = message
        self.tally.add(message.topic, message.publisher, kept_size(message.topic, message.payload))

    def _drop(self, topic: str) -> None:
        self._messages.pop(topic, None)
        self.tally.remove(topic)

    def __getitem__(self, topic: str) -> Message:
        return self._messages[topic]

    def __iter__(self) -> Iterator[str]:
        return iter(self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    @staticmethod
    def updates(message: Message) -> list[MetaUpdate]:
        """The durable record that sets (or, with an empty payload, clears, MQTT-3.3.1-10) the
        retained message of `message.topic`, to be written with the message itself."""
        record = encode_message(message) if message.payload else None
        return [MetaUpdate(KIND_RETAINED, message.topic, record)]

    def apply(self, message: Message) -> None:
        """The store confirmed `message` with its retained record: keep it (or clear the topic)
        and tell the peers."""
        if message.payload:
            self._keep(message)
            record = encode_message(message)
        else:
            self._drop(message.topic)
            record = b""
        if self.announce is not None:
            self.announce(message.topic, record)

    def keep_in_memory(self, message: Message) -> None:
        """Set a retained message that lives in this process only (`$SYS` statistics)."""
        self._messages[message.topic] = message

    def restore(self, records: Mapping[str, bytes]) -> None:
        """Take the stored records as they are (start-up; a re-read after a peer link was down)."""
        self._messages = {}
        self.tally.clear()
        for data in records.values():
            self._keep(decode_message(data))

    def from_peer(self, topic: str, record: bytes) -> None:
        """A peer set (or, with an empty record, cleared) a topic's retained message."""
        if record:
            self._keep(decode_message(record))
        else:
            self._drop(topic)

    def published_count(self) -> int:
        """Retained messages of clients and backends (not this node's `$SYS` statistics)."""
        return sum(1 for topic in self._messages if not topic.startswith(SYS_PREFIX))

    def matching(self, filters: list[tuple[str, int]]) -> Iterator[tuple[Message, int]]:
        """Each retained message matching any of `filters` (filter, granted QoS), with the
        highest QoS granted among the filters it matches."""
        for topic, message in list(self._messages.items()):
            best = -1
            for topic_filter, granted in filters:
                if granted > best and topic_matches(topic_filter, topic):
                    best = granted
            if best >= 0:
                yield message, best
