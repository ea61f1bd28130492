"""A client's socket read no faster than its publish rate limits (`client_publish_rate`,
`client_publish_bytes_rate`): backpressure, never loss.

`ReadPacer` belongs to one connection that has limits (a connection without any has none, so
the hot path pays one attribute check). It is told what each read brought; when the client is
over a limit it stops reading the socket (`Link.hold_reading`) until the buckets of
`bridge.access.ratelimit.PublishPacer` are out of debt. What was read is handled as usual:
nothing is dropped, and the client is never disconnected for its rate. TCP flow control then
slows the client; a v5 client also keeps within the Receive Maximum it was told, since its
messages already read are acknowledged as they are stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.access.ratelimit import PublishPacer
from bridge.mqtt.packets import Publish
from bridge.node.roles import PAUSED_BY_RATE

if TYPE_CHECKING:
    from bridge.listeners.link import Link


class ReadPacer:
    """The publish limits of one connection and the pause they impose on its reads."""

    __slots__ = ("conn", "limits", "pausing")

    def __init__(self, conn: Link, limits: PublishPacer) -> None:
        self.conn = conn
        self.limits = limits
        self.pausing = False

    @classmethod
    def of(
        cls, conn: Link, messages_per_second: float, bytes_per_second: float
    ) -> ReadPacer | None:
        """The pacer of these limits for `conn`, or None when both are 0 (unlimited)."""
        limits = PublishPacer.of(messages_per_second, bytes_per_second, conn.loop.time())
        return None if limits is None else cls(conn, limits)

    def charge(self, packets: list[Any], size: int) -> None:
        """One read of `size` bytes brought `packets`: stop reading while over a limit."""
        conn = self.conn
        publishes = sum(1 for packet in packets if type(packet) is Publish)
        wait = self.limits.charge(publishes, size, conn.loop.time())
        if wait > 0 and not self.pausing:
            self.pausing = True
            conn.node.metrics.inc("publish_rate_pauses")
            conn.hold_reading(PAUSED_BY_RATE)
            conn.loop.call_later(wait, self._paced)

    def _paced(self) -> None:
        """A pause is over: read on, or wait the rest if the client is still over (a new
        pacer may have replaced this one: then only it decides)."""
        conn = self.conn
        if conn.closed or conn.pacer is not self:
            return
        wait = self.limits.wait(conn.loop.time())
        if wait > 0:
            conn.loop.call_later(wait, self._paced)
            return
        self.pausing = False
        conn.release_reading(PAUSED_BY_RATE)
