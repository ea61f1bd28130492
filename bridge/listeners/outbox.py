"""What a connection writes to its socket: every packet queued during one loop turn goes out in one
write, and whether the socket can take more.

A subscriber of a busy topic is sent many small packets in one turn of the event loop (a QoS 0
fan-out, a delivery's read of its queue, the acknowledgements of a publisher's window). Writing
each at once would be a system call per packet; the `Outbox` keeps them and writes them joined at
the end of the turn, or as soon as `WRITE_AT` bytes wait (one write of a large turn's worth would
hold a large joined copy). The socket's own buffer tells it when the client reads slower than it
is written to (`pause_writing`, `resume_writing` of the protocol): then `writable` is False and
the node's deliveries wait, and QoS 0 messages go through `bridge.node.qos0_flow`.
"""

from __future__ import annotations

import asyncio
from typing import Final

from bridge.counters import Metrics

WRITE_AT: Final = 64 * 1024
"""This much queued for a client is written at once, not at the end of the turn: the size of the
largest read a client gets in one turn (`bridge.listeners.connection.READ_TURN`), so one turn's
work for it is about one write: docs/design.md, "How a PUBLISH travels"."""


class Outbox:
    """The bytes queued for one socket this loop turn, and whether the socket takes more."""

    __slots__ = ("_flush_handle", "_out", "_out_size", "loop", "metrics", "paused", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> None:
        self.loop = loop
        self.metrics = metrics
        """Where the bytes written are counted (`bytes_out`)."""
        self.transport: asyncio.Transport | None = None
        """The socket written to (None until connected)."""
        self.paused = False
        """True while the socket's buffer is over its high-water mark (the client reads slower
        than it is written to)."""
        self._out: list[bytes] | None = None
        """What was queued this loop turn, in order (None: nothing; an idle client keeps no
        list)."""
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        """The end-of-turn write, once something is queued."""

    def queue(self, data: bytes) -> None:
        """Queue bytes: written at the end of this loop turn, or now if `WRITE_AT` bytes wait."""
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self._out_size += len(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)
        elif self._out_size >= WRITE_AT:
            self._write_out()

    @property
    def holding(self) -> bool:
        """Whether bytes wait to be written."""
        return bool(self._out)

    def flush(self) -> None:
        """Write what is queued now (the connection closes: the packet saying why goes out)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()

    def discard(self) -> None:
        """The socket is gone: what was queued for it this loop turn cannot be written."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
            self._out = None
            self._out_size = 0

    def _flush(self) -> None:
        self._flush_handle = None
        self._write_out()

    def _write_out(self) -> None:
        out = self._out
        if not out or self.transport is None:
            return
        self._out = None
        self._out_size = 0
        data = out[0] if len(out) == 1 else b"".join(out)
        self.transport.write(data)
        self.metrics.bytes_out += len(data)
