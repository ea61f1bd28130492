"""QoS 0 publishers go at the pace of the subscribers they feed; a stuck subscriber loses its QoS 0
messages instead, and is cut off.

A connected subscriber's socket takes what its client reads. Once the buffer in front of it is
over its high-water mark (`Connection.pause_writing`) and a QoS 0 message of a publisher on this
node is still sent to it, the node stops reading that publisher until the subscriber's buffer has
drained (`resume_writing`). TCP flow control then slows the publisher to its subscribers' pace, and
nothing is dropped: this is how one event loop serves a publisher and its subscriber evenly, where
reading the publisher as fast as it sends would bury the subscriber in a buffer it never catches
up with.

A subscriber that does not drain within `qos0_publisher_wait` seconds is stuck: publishers no
longer wait for it (one stalled device must not stall a publisher and its other subscribers) until
it drains. Its buffer grows up to `write_buffer_high`; QoS 0 messages to it beyond that are dropped,
counted and logged, and after `slow_consumer_timeout` over that mark it is cut off. A publisher is
never made to wait for itself, nor for a subscriber on a peer (the peer link has its own buffer).
QoS 1/2 messages never come here: they wait in the store for their reader, and their publishers
are slowed by `bridge.node.congestion`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from bridge.node.flow import PAUSED_BY_SUBSCRIBER

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.node.roles import ClientLink
    from bridge.settings import Config

log = logging.getLogger("bridge.connection")

SEND: Final = 1
"""What to do with a QoS 0 message for a subscriber whose socket buffer is over its high-water
mark: send it (its publisher, if read on this node, may wait for the subscriber meanwhile)."""
DROP: Final = 0
"""Drop it: the subscriber's buffer is over `write_buffer_high` (counted and logged; a subscriber
over it for `slow_consumer_timeout` is cut off)."""


class Qos0Flow:
    """Which publishers wait for which subscribers; which subscribers are too slow to wait for."""

    __slots__ = ("_feeders", "_over", "_stuck", "_waits", "config", "connections", "metrics")

    def __init__(
        self, *, config: Config, metrics: Metrics, connections: Mapping[str, ClientLink]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.connections = connections
        self._feeders: dict[ClientLink, set[ClientLink]] = {}
        """Subscriber -> the publishers whose reading waits for it."""
        self._waits: dict[ClientLink, tuple[asyncio.TimerHandle, set[ClientLink]]] = {}
        """Publisher -> (the end of its wait, the subscribers it waits for)."""
        self._stuck: set[ClientLink] = set()
        """Subscribers that did not drain in time: publishers do not wait for them."""
        self._over: dict[ClientLink, float] = {}
        """Subscriber -> since when (loop time) its buffer is over `write_buffer_high`."""

    def when_full(self, subscriber: ClientLink, publisher: str, buffered: int) -> int:
        """A QoS 0 message of `publisher` (a ClientId) is for `subscriber`, whose socket buffer
        holds `buffered` bytes, over its high-water mark: `SEND` it (and its publisher, if
        connected here, waits for the subscriber before it is read again) or `DROP` it."""
        if buffered > self.config.write_buffer_high:
            self._drop(subscriber)
            return DROP
        if self.config.qos0_publisher_wait and subscriber not in self._stuck:
            feeder = self.connections.get(publisher)
            if feeder is not None and feeder is not subscriber and not feeder.closed:
                self._wait(feeder, subscriber)
        return SEND

    def drained(self, subscriber: ClientLink) -> None:
        """`subscriber`'s buffer is back under its low-water mark: its publishers read on."""
        self._over.pop(subscriber, None)
        self._stuck.discard(subscriber)
        feeders = self._feeders.pop(subscriber, None)
        if feeders:
            for feeder in feeders:
                self._unwait(feeder, subscriber)

    def gone(self, conn: ClientLink) -> None:
        """`conn` disconnected: nobody waits for it, and it waits for nobody."""
        self.drained(conn)
        wait = self._waits.pop(conn, None)
        if wait is not None:
            wait[0].cancel()
            for subscriber in wait[1]:
                feeders = self._feeders.get(subscriber)
                if feeders is not None:
                    feeders.discard(conn)
                    if not feeders:
                        del self._feeders[subscriber]

    @property
    def waiting(self) -> int:
        """How many publishers wait for subscribers now."""
        return len(self._waits)

    def _wait(self, feeder: ClientLink, subscriber: ClientLink) -> None:
        feeders = self._feeders.get(subscriber)
        if feeders is None:
            feeders = self._feeders[subscriber] = set()
        elif feeder in feeders:
            return
        feeders.add(feeder)
        wait = self._waits.get(feeder)
        if wait is not None:
            wait[1].add(subscriber)
            return
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.config.qos0_publisher_wait, self._waited, feeder)
        self._waits[feeder] = (timer, {subscriber})
        self.metrics.inc("qos0_publisher_waits")
        feeder.hold_reading(PAUSED_BY_SUBSCRIBER)

    def _unwait(self, feeder: ClientLink, subscriber: ClientLink) -> None:
        wait = self._waits.get(feeder)
        if wait is None:
            return
        wait[1].discard(subscriber)
        if not wait[1]:
            del self._waits[feeder]
            wait[0].cancel()
            feeder.release_reading(PAUSED_BY_SUBSCRIBER)

    def _waited(self, feeder: ClientLink) -> None:
        """`feeder` waited `qos0_publisher_wait`: the subscribers it waits for are stuck."""
        wait = self._waits.pop(feeder, None)
        if wait is None:
            return
        for subscriber in wait[1]:
            self._stuck.add(subscriber)
            self.metrics.inc("qos0_subscribers_stuck")
            log.warning(
                "client %s (%s): has not read its QoS 0 messages for %.1f s; publishers no "
                "longer wait for it (messages to it drop past write_buffer_high=%d bytes)",
                subscriber.client_id,
                subscriber.peer,
                self.config.qos0_publisher_wait,
                self.config.write_buffer_high,
            )
            for other in self._feeders.pop(subscriber, ()):
                self._unwait(other, subscriber)  # `feeder` itself no longer waits: a no-op
        feeder.release_reading(PAUSED_BY_SUBSCRIBER)

    def _drop(self, subscriber: ClientLink) -> None:
        self.metrics.inc("dropped_slow_consumer")
        now = asyncio.get_running_loop().time()
        since = self._over.get(subscriber)
        if since is None:
            self._over[subscriber] = now
            log.warning(
                "client %s (%s): not reading; dropping QoS 0 messages to it",
                subscriber.client_id,
                subscriber.peer,
            )
        elif now - since > self.config.slow_consumer_timeout:
            subscriber.close(
                f"slow consumer: socket buffer over {self.config.write_buffer_high} "
                f"bytes for {self.config.slow_consumer_timeout:.0f} s"
            )
