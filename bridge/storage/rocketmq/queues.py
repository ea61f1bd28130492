"""What the RocketMQ store knows of its bridge queues: their light queues and their ends.

`LmqNames` maps bridge queues to the light message queues (LMQs) holding them and back, in the
store's namespace. `QueueEnds` is the store's view of each queue's end (see "Queue ends" in the
docstring of store.py) and the average message size its backlog estimates use. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.storage.rocketmq.mapping import lmq_name, unescape_name
from bridge.storage.rocketmq.messages import LMQ_PREFIX

__all__ = ["DEFAULT_MESSAGE_SIZE", "LmqNames", "QueueEnds"]

DEFAULT_MESSAGE_SIZE = 512.0
"""The backlog estimate's message size until this store has seen messages of its own."""


class LmqNames:
    """Bridge queue <-> LMQ name, for the queues of one namespace.

    A long name is hashed into its LMQ name ("|H..."), which cannot be mapped back: the names
    this store has given out are remembered, in both directions.
    """

    __slots__ = ("_lmqs", "_names", "namespace")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._lmqs: dict[str, str] = {}
        """LMQ name -> bridge queue, for every queue named so far."""
        self._names: dict[str, str] = {}
        """The same map the other way (escaping a name is not free on the publish path)."""

    def remember(self, queue: str) -> str:
        """The LMQ name of `queue`, remembered so that `queue_of` maps it back."""
        name = self._names.get(queue)
        if name is None:
            name = lmq_name(self.namespace + queue)
            self._names[queue] = name
            self._lmqs[name] = queue
        return name

    def queue_of(self, name: str) -> str | None:
        """The bridge queue LMQ `name` holds, if it is one of this namespace's (and not a hashed
        name this store never gave out)."""
        queue = self._lmqs.get(name)
        if queue is not None:
            return queue
        if not name.startswith(LMQ_PREFIX) or "|H" in name:
            return None
        queue = unescape_name(name[len(LMQ_PREFIX) :])
        if self.namespace:
            if not queue.startswith(self.namespace):
                return None
            queue = queue[len(self.namespace) :]
        return queue


SEEN_KEYS = 4096
"""Keys of messages held reads brought that `QueueEnds` remembers, at most (their SEND_OK
usually comes within a millisecond)."""


class QueueEnds:
    """The end of every bridge queue as far as this store knows, and its average message size.

    An end only grows by what this store learns (`note`) and by its own confirmed messages
    (`count_stored`); `correct` sets one back when a read proved it was counted ahead.
    """

    __slots__ = ("_ends", "_seen", "avg_size")

    def __init__(self) -> None:
        self._ends: dict[str, int] = {}
        self.avg_size = DEFAULT_MESSAGE_SIZE
        self._seen: dict[tuple[str, str], None] = {}
        """(queue, message key) of messages a held read brought and noted (`seen`), oldest
        first: a read held at a queue's end is answered as the broker dispatches, often before
        the SEND_OK of this store's own message, which must then not be counted again."""
        """Moving average of the size of this store's messages (payload + topic)."""

    def end(self, queue: str) -> int:
        """The known end of `queue` (0 for a queue this store knows nothing of)."""
        return self._ends.get(queue, 0)

    def note(self, queue: str, end: int) -> None:
        """Learn that `queue` holds messages up to `end` (an end never goes back here)."""
        if end > self._ends.get(queue, 0):
            self._ends[queue] = end

    def correct(self, queue: str, end: int, seen: int) -> None:
        """Set the end of `queue` back to `end`, the broker's, after this store counted ahead:
        only if it is still `seen`, what the read that proved it was looking for. A message
        confirmed while that read waited was counted on top; its dispatch to the queue may come
        later than the broker's answer, so setting the end back then would hide it (and every
        message after it until the next one is stored)."""
        if self._ends.get(queue, 0) == seen:
            self._ends[queue] = max(end, 0)

    def seen(self, queue: str, keys: Iterable[str], end: int) -> None:
        """A held read brought the messages with these keys, `queue` ending at `end` after
        them: noted, and not counted again when one of them is this store's own and its
        SEND_OK comes after (`count_stored`). The last `SEEN_KEYS` are remembered."""
        seen = self._seen
        for key in keys:
            seen[(queue, key)] = None
        while len(seen) > SEEN_KEYS:
            del seen[next(iter(seen))]
        self.note(queue, end)

    def count_stored(self, queues: Iterable[str], size: int, key: str = "") -> None:
        """One more message of `size` bytes (its key `key`), confirmed in each of `queues`,
        unless a held read already brought it there (`seen`)."""
        ends = self._ends
        seen = self._seen
        for queue in queues:
            if seen and (queue, key) in seen:
                del seen[(queue, key)]
                continue
            ends[queue] = ends.get(queue, 0) + 1
        self.avg_size += (size - self.avg_size) / 64

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        """(messages, estimated bytes) in `queue` at or after `offset`."""
        count = max(0, self._ends.get(queue, 0) - offset)
        return count, int(count * self.avg_size)
