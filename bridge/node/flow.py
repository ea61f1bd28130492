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
socket. It is kept small, since every connection has one, an idle one too: what only some
connections need (publish limits, held acknowledgements) is an object of its own, made when
needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
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
    """One connection's reasons not to read its socket, the count of its messages waiting for the
    store, its publish pacing and the acknowledgements held back for lagging subscribers."""

    __slots__ = (
        "_held", "_pacing", "pauses", "pending", "socket",
    )  # fmt: skip

    def __init__(self) -> None:
        self.socket: Readable | None = None
        """The socket paused and resumed (None until it is connected, and once it is closed:
        then the reasons are still kept, and nothing is called)."""
        self.pauses = 0
        """Why reading the socket is paused: a set of `PAUSED_*` bits (0: it is not)."""
        self.pending = 0
        """QoS 1/2 PUBLISHes handed to the node and not yet answered."""
        self._pacing: _Pacing | None = None
        """The client's publish limits (None: unlimited, the one check a read makes)."""
        self._held: _HeldAcks | None = None
        """The acknowledgements held back and why (None: none are held; most connections never
        hold one)."""

    # -- reading the socket ----------------------------------------------------------------------

    def hold(self, reason: int) -> None:
        """Stop reading the socket until `release(reason)`."""
        if not self.pauses and self.socket is not None:
            self.socket.pause_reading()
        self.pauses |= reason

    def release(self, reason: int) -> bool:
        """End one reason to stop reading; with none left, read on: True then (the connection
        counts its keepalive from here: a client that was not read was not silent)."""
        if not self.pauses & reason:
            return False
        self.pauses &= ~reason
        if self.pauses or self.socket is None:
            return False
        self.socket.resume_reading()
        return True

    # -- waiting for the store -------------------------------------------------------------------

    def publish_taken(self, max_pending: int) -> None:
        """A QoS 1/2 PUBLISH goes to the store (count it before: a failing store may answer at
        once): stop reading once `max_pending` (`max_inbound_pending`) wait."""
        self.pending += 1
        if self.pending >= max_pending and not self.pauses & PAUSED_BY_STORE:
            self.hold(PAUSED_BY_STORE)

    def publish_answered(self, max_pending: int) -> bool:
        """A counted PUBLISH is answered: True when the store's pause may end, once half of the
        `max_pending` are answered (not at each answer: the client would be paused again at the
        next PUBLISH). The caller then releases `PAUSED_BY_STORE` through its connection, which
        notes when the socket is read again."""
        self.pending -= 1
        return bool(self.pauses & PAUSED_BY_STORE) and self.pending <= max_pending // 2

    # -- publish pacing --------------------------------------------------------------------------

    def limit_publishes(
        self,
        messages_per_second: float,
        bytes_per_second: float,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        release: Callable[[int], None],
    ) -> None:
        """Pace the client to these rates (0: unlimited) on `loop`'s clock, counting each pause
        in `metrics` (`publish_rate_pauses`). A rate pause is ended through `release` (the
        connection's `release_reading`, which notes when its socket is read again), as every
        other pause is. A new pacer starts with full buckets: the caller ends a rate pause
        under the old limits with `release(PAUSED_BY_RATE)`."""
        pacing = self._pacing
        if pacing is not None and pacing.timer is not None:
            pacing.timer.cancel()
        limits = PublishPacer.of(messages_per_second, bytes_per_second, loop.time())
        self._pacing = None if limits is None else _Pacing(limits, loop, metrics, release)

    @property
    def paced(self) -> bool:
        """Whether the client has publish limits."""
        return self._pacing is not None

    def charge(self, packets: Sequence[object], size: int) -> None:
        """One read of `size` bytes brought `packets`: stop reading while the client is over a
        publish limit (only PUBLISH packets count as messages; every byte counts)."""
        pacing = self._pacing
        if pacing is None:
            return
        publishes = 0
        for packet in packets:
            if type(packet) is Publish:
                publishes += 1
        loop = pacing.loop
        wait = pacing.limits.charge(publishes, size, loop.time())
        if wait > 0 and pacing.timer is None:
            pacing.metrics.inc("publish_rate_pauses")
            self.hold(PAUSED_BY_RATE)
            pacing.timer = loop.call_later(wait, self._rate_paused)

    def _rate_paused(self) -> None:
        """A rate pause is over: read on, or wait the rest if the client is still over."""
        pacing = self._pacing
        if pacing is None:
            return
        pacing.timer = None
        wait = pacing.limits.wait(pacing.loop.time())
        if wait > 0:
            pacing.timer = pacing.loop.call_later(wait, self._rate_paused)
            return
        pacing.release(PAUSED_BY_RATE)

    # -- acknowledgements held for lagging subscribers -------------------------------------------

    def hold_acks(self, reason: str) -> None:
        """Hold the client's PUBACKs/PUBRECs, in order, until every reason is released."""
        held = self._held
        if held is None:
            held = self._held = _HeldAcks()
        held.reasons.add(reason)

    def ack_waits(self, data: bytes, counted: bool) -> bool:
        """An acknowledgement is ready: True if it must wait behind held ones (kept here, in
        order), False to send it now."""
        held = self._held
        if held is None:
            return False
        held.waiting.append((data, counted))
        return True

    def release_acks(self, reason: str) -> list[tuple[bytes, bool]]:
        """One reason to hold acknowledgements is gone: with none left, the acknowledgements
        that waited, in order, to send now (empty while another reason holds them)."""
        held = self._held
        if held is None:
            return []
        held.reasons.discard(reason)
        if held.reasons:
            return []
        self._held = None
        return held.waiting

    # -- the end ---------------------------------------------------------------------------------

    def closed(self) -> None:
        """The connection is closed: its socket is no longer paused or resumed, and a rate pause
        does not fire."""
        self.socket = None
        pacing = self._pacing
        if pacing is not None and pacing.timer is not None:
            pacing.timer.cancel()
            pacing.timer = None


class _Pacing:
    """A connection's publish limits, and the end of the pause they impose now."""

    __slots__ = ("limits", "loop", "metrics", "release", "timer")

    def __init__(
        self,
        limits: PublishPacer,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        release: Callable[[int], None],
    ) -> None:
        self.limits = limits
        self.loop = loop
        self.metrics = metrics
        self.release = release
        self.timer: asyncio.TimerHandle | None = None
        """The end of the current rate pause (None: not paused for its rate)."""


class _HeldAcks:
    """Acknowledgements held back, in order, and why: the lagging subscribers' ClientIds."""

    __slots__ = ("reasons", "waiting")

    def __init__(self) -> None:
        self.reasons: set[str] = set()
        self.waiting: list[tuple[bytes, bool]] = []
        """(the packet, whether it answers a counted publish), in order."""
