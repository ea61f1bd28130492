"""How a node stamps the messages it accepts: a key unique across nodes and restarts, the
publish time and the node's id."""

from __future__ import annotations

import time
import uuid
from typing import Final

from bridge.storage.base import Message

_now: Final = time.time  # a C static once compiled, not a lookup in the globals per message


class Stamper:
    """Makes `Message`s as this node stores them."""

    __slots__ = ("_counter", "_prefix", "node_id")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._counter = 0
        """The last key's number (a native int once compiled: no iterator call per message)."""
        self._prefix = f"{node_id}-{uuid.uuid4().hex[:8]}-"

    def next_key(self) -> str:
        """A message key unique across nodes and restarts."""
        self._counter += 1
        return f"{self._prefix}{self._counter}"

    def stamp(self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str) -> Message:
        """A message as this node stores it: unique key, publish time, node id."""
        return Message(
            topic,
            payload,
            qos,
            retain,
            publisher,
            self.next_key(),
            int(_now() * 1000),
            self.node_id,
        )
