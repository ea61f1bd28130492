"""Why one client's socket is not read, and which of its acknowledgements wait: a connection's
backpressure, decided in one place.

The bridge never drops or refuses what a client publishes because the node is busy; it reads the
client later instead, and TCP flow control slows the client. A connection stops reading its socket
for any of these reasons, each a bit of `ConnectionFlow.pauses`, and reads on once none is left:

- `PAUSED_BY_STORE`: `max_inbound_pending` of its QoS 1/2 messages wait for the store; reading
  resumes once half of them are answered (`publish_taken`, `publish_answered`).
- `PAUSED_BY_RATE`: it sends faster than its publish limits (`client_publish_rate`,
  `client_publish_bytes_rate`, `bridge.access.ratelimit.PublishPacer`): it is read again once
  its buckets are out of debt. Nothing read is dropped, and nobody is disconnected for its rate.
- `PAUSED_BY_SUBSCRIBER`: a subscriber it sends QoS 0 messages to has not read them yet; the
  node-wide `bridge.node.qos0_flow.Qos0Flow` decides which publishers wait for whom.
- `PAUSED_FOR_TURN`: it sent a full read's worth in one go; it is read again next loop turn, so
  one busy client cannot starve the others of the event loop.
- `PAUSED_FOR_CONNACK`: its CONNECT is being decided (`bridge.listeners.preauth`).

Acknowledgements are the other lever: while a subscriber of its messages is far behind
(`bridge.node.congestion.Congestion` decides, node-wide), the client's PUBACKs/PUBRECs wait here,
in order, and its in-flight window fills; its socket is still read, so its own acknowledgements of
what it receives keep flowing.

`ConnectionFlow` is I/O-free except for the two calls it makes on the socket (`pause_reading`,
`resume_reading`) and the timer of a rate pause, so each decision is unit-tested with a fake
socket and a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, Protocol

from bridge.access.ratelimit import PublishPacer
from bridge.counters import Metrics
from bridge.mqtt.packets import Publish

PAUSED_BY_STORE: Final = 1
"""Reading paused: too many of the client's QoS 1/2 messages wait for the store."""
PAUSED_BY_RATE: Final = 2
"""Reading paused: the client sends faster than its publish rate limits."""
PAUSED_BY_SUBSCRIBER: Final = 4
"""Reading paused: a subscriber this client sends QoS 0 messages to has not read them yet
(`bridge.node.qos0_flow`)."""
PAUSED_FOR_TURN: Final = 8
"""Reading paused until the next loop turn: the client sent a full read's worth already."""
PAUSED_FOR_CONNACK: Final = 16
"""Reading paused: the client's CONNECT is being decided (`bridge.listeners.preauth`)."""


class Readable(Protocol):
    """The socket side a `ConnectionFlow` pauses: an asyncio transport."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class ConnectionFlow:
    """One connection's reasons not to read its socket, its publish pacing, the count of its
    messages waiting for the store, and the acknowledgements held back for lagging subscribers."""

    __slots__ = (
        "_ack_reasons", "_acks_waiting", "_paced", "_rate_pause", "_store_pause", "loop",
        "max_pending", "metrics", "pauses", "pending", "resumed_at", "socket",
    )  # fmt: skip

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int, metrics: Metrics) -> None:
        self.loop = loop
        self.max_pending = max_pending
        """`max_inbound_pending`: the QoS 1/2 messages that may wait for the store before the
        socket is no longer read."""
        self.metrics = metrics
        """Where each pause the publish limits impose is counted (`publish_rate_pauses`)."""
        self.socket: Readable | None = None
        """The socket paused and resumed (None until it is connected, and once it is closed:
        then the reasons are still kept, and nothing is called)."""
        self.pauses = 0
        """Why reading the socket is paused: a set of `PAUSED_*` bits (0: it is not)."""
        self.pending = 0
        """QoS 1/2 PUBLISHes handed to the node and not yet answered."""
        self.resumed_at = 0.0
        """When (loop time) the socket was last read again after a pause: a client that was not
        read was not silent, and its keepalive counts from here."""
        self._store_pause = False
        self._paced: PublishPacer | None = None
        """The client's publish limits (None: unlimited, the one check a read makes)."""
        self._rate_pause: asyncio.TimerHandle | None = None
        """The end of the current rate pause (None: not paused for its rate)."""
        self._ack_reasons: set[str] | None = None
        """Why acknowledgements are held: the lagging subscribers' ClientIds (None: they are
        not held)."""
        self._acks_waiting: list[tuple[bytes, bool]] | None = None
        """The held acknowledgements, in order: (the packet, whether it answers a counted
        publish). None while none are held: most connections never hold one."""

    # -- reading the socket ----------------------------------------------------------------------

    def hold(self, reason: int) -> None:
        """Stop reading the socket until `release(reason)`."""
        if not self.pauses and self.socket is not None:
            self.socket.pause_reading()
        self.pauses |= reason

    def release(self, reason: int) -> None:
        """End one reason to stop reading; with none left, read on."""
        if not self.pauses & reason:
            return
        self.pauses &= ~reason
        if not self.pauses and self.socket is not None:
            self.socket.resume_reading()
            self.resumed_at = self.loop.time()

    # -- waiting for the store -------------------------------------------------------------------

    def publish_taken(self) -> None:
        """A QoS 1/2 PUBLISH goes to the store (count it before: a failing store may answer at
        once): stop reading once `max_pending` wait."""
        self.pending += 1
        if self.pending >= self.max_pending and not self._store_pause:
            self._store_pause = True
            self.hold(PAUSED_BY_STORE)

    def publish_answered(self) -> None:
        """A counted PUBLISH is answered: read on once half of the pending ones are (not at
        each answer: the client would be paused again at the next PUBLISH)."""
        self.pending -= 1
        if self._store_pause and self.pending <= self.max_pending // 2:
            self._store_pause = False
            self.release(PAUSED_BY_STORE)

    # -- publish pacing --------------------------------------------------------------------------

    def limit_publishes(self, messages_per_second: float, bytes_per_second: float) -> None:
        """Pace the client to these rates (0: unlimited); a new pacer starts with full buckets,
        so a rate pause ends here."""
        self._paced = PublishPacer.of(messages_per_second, bytes_per_second, self.loop.time())
        if self._rate_pause is not None:
            self._rate_pause.cancel()
            self._rate_pause = None
        self.release(PAUSED_BY_RATE)

    @property
    def paced(self) -> bool:
        """Whether the client has publish limits."""
        return self._paced is not None

    def charge(self, packets: Sequence[object], size: int) -> None:
        """One read of `size` bytes brought `packets`: stop reading while the client is over a
        publish limit (only PUBLISH packets count as messages; every byte counts)."""
        limits = self._paced
        if limits is None:
            return
        publishes = 0
        for packet in packets:
            if type(packet) is Publish:
                publishes += 1
        wait = limits.charge(publishes, size, self.loop.time())
        if wait > 0 and self._rate_pause is None:
            self.metrics.inc("publish_rate_pauses")
            self.hold(PAUSED_BY_RATE)
            self._rate_pause = self.loop.call_later(wait, self._rate_paused)

    def _rate_paused(self) -> None:
        """A rate pause is over: read on, or wait the rest if the client is still over."""
        self._rate_pause = None
        limits = self._paced
        wait = 0.0 if limits is None else limits.wait(self.loop.time())
        if wait > 0:
            self._rate_pause = self.loop.call_later(wait, self._rate_paused)
            return
        self.release(PAUSED_BY_RATE)

    # -- acknowledgements held for lagging subscribers -------------------------------------------

    def hold_acks(self, reason: str) -> None:
        """Hold the client's PUBACKs/PUBRECs, in order, until every reason is released."""
        reasons = self._ack_reasons
        if reasons is None:
            reasons = self._ack_reasons = set()
        reasons.add(reason)

    def ack_waits(self, data: bytes, counted: bool) -> bool:
        """An acknowledgement is ready: True if it must wait behind held ones (kept here, in
        order), False to send it now."""
        if self._ack_reasons is None:
            return False
        waiting = self._acks_waiting
        if waiting is None:
            waiting = self._acks_waiting = []
        waiting.append((data, counted))
        return True

    def release_acks(self, reason: str) -> list[tuple[bytes, bool]]:
        """One reason to hold acknowledgements is gone: with none left, the acknowledgements
        that waited, in order, to send now (empty while another reason holds them)."""
        reasons = self._ack_reasons
        if reasons is None:
            return []
        reasons.discard(reason)
        if reasons:
            return []
        self._ack_reasons = None
        waiting = self._acks_waiting
        self._acks_waiting = None
        return [] if waiting is None else waiting

    # -- the end ---------------------------------------------------------------------------------

    def closed(self) -> None:
        """The connection is closed: its socket is no longer paused or resumed, and a rate pause
        does not fire."""
        self.socket = None
        if self._rate_pause is not None:
            self._rate_pause.cancel()
            self._rate_pause = None
