"""What a connection writes to its socket in one loop turn: every packet queued during the turn goes
out in one write.

A subscriber of a busy topic is sent many small packets in one turn of the event loop (a QoS 0
fan-out, a delivery's read of its queue, the acknowledgements of a publisher's window). Writing
each at once would be a system call per packet; the packets of a turn are kept and written joined
at the end of the turn, or as soon as `WRITE_AT` bytes wait (one write of a large turn's worth
would hold a large joined copy). What a turn queued is held only until it is written, so an idle
connection holds nothing, and a turn that queues a single packet (the common case: one PUBACK,
one PUBLISH) holds just its bytes; an `Outbox` is made by a turn's second packet
(`bridge.listeners.connection.Connection._queue`, which holds one or the other). Whether the
socket takes more is the connection's to say (asyncio's `pause_writing` and `resume_writing`).
"""

from __future__ import annotations

from typing import Final

WRITE_AT: Final = 64 * 1024
"""This much queued for a client is written at once, not at the end of the turn: the size of the
largest read a client gets in one turn (`bridge.listeners.connection.READ_TURN`), so one turn's
work for it is about one write: docs/design.md, "How a PUBLISH travels"."""


class Outbox:
    """The packets one loop turn queued for one socket, once there are two or more, in order."""

    __slots__ = ("_chunks", "size")

    def __init__(self, first: bytes, second: bytes) -> None:
        self._chunks = [first, second]
        self.size = len(first) + len(second)
        """The bytes queued."""

    def add(self, data: bytes) -> int:
        """Queue one more packet after the others; returns the bytes now queued."""
        self._chunks.append(data)
        size = self.size = self.size + len(data)
        return size

    def joined(self) -> bytes:
        """What is queued, as the bytes of one write."""
        return b"".join(self._chunks)
