"""Telling peers what this node stored for their readers, and covering for what a peer could not
tell this node.

notify leaves every bridge's messages to the bridge that stored them (docs/design.md, "What
notify does not read"), so the storing node announces them itself. `Announcer.wake` merges the
announcements of one event-loop turn per peer and sends them as a `Grew` with the queues' ends
as this node counts them, then a `Wake` (a reader the counts leave caught up waits for one more
message, in case they lag behind other writers).

The other direction: a peer that dies or loses its link between storing a message and telling
this node leaves this node's readers unwoken. `refresh_soon` re-reads the ends of the queues this
node's clients read (a second later, when the broker has surely indexed what the peer had
confirmed) and wakes them; the cluster calls it when a link goes down, when a peer is declared
dead, and every `PARTITION_REFRESH_INTERVAL` while a live member has no link to this node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from bridge.cluster import wire
from bridge.router.queues import ANY_PEER

__all__ = ["PARTITION_REFRESH_INTERVAL", "PEER_GONE_REFRESH_DELAY", "Announcer"]

PARTITION_REFRESH_INTERVAL = 5.0
"""While a live member has no link to this node, re-read the readers' queue ends this often: what
it stores for this node's readers meanwhile waits at most this long."""
PEER_GONE_REFRESH_DELAY = 1.0
"""Seconds after a peer's link went down (or the peer was declared dead) before this node
re-reads its readers' queue ends: by then the broker has indexed whatever the peer had stored."""


class FrameSink(Protocol):
    """A peer link as far as announcements go."""

    def send(self, frame: wire.Frame) -> None:
        """Queue a frame to the peer."""
        ...


class Announcer:
    """Wakes to peers, merged per loop turn; re-reads of queue ends after a peer's silence."""

    __slots__ = (
        "_links",
        "_pending",
        "_refresh",
        "_refresh_ends",
        "_refreshed_at",
        "_scheduled",
        "_spawn",
    )

    def __init__(
        self,
        links: Mapping[str, FrameSink],
        refresh_ends: Callable[[], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]],
    ) -> None:
        self._links = links
        self._refresh_ends = refresh_ends
        self._spawn = spawn
        """Runs background work whose failures are logged (the node's `spawn`)."""
        self._pending: dict[str, dict[str, int]] = {}
        """Peer -> queue -> end: the wakes of this event-loop turn, not sent yet."""
        self._scheduled: asyncio.Handle | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = 0.0

    def wake(self, peer: str, ends: dict[str, int]) -> None:
        """Messages were stored on these queues, which end at least at `ends` by this node's
        count. Sent at the end of this event-loop turn with the turn's other wakes for `peer`."""
        pending = self._pending.get(peer)
        if pending is None:
            pending = self._pending[peer] = {}
            if self._scheduled is None:
                self._scheduled = asyncio.get_running_loop().call_soon(self._send)
        for queue, end in ends.items():
            if end > pending.get(queue, -1):
                pending[queue] = end

    def _send(self) -> None:
        self._scheduled = None
        wakes, self._pending = self._pending, {}
        for peer, ends in wakes.items():
            if peer == ANY_PEER:  # a session on its way to a node not known yet: tell them all
                links = list(self._links.values())
            else:
                link = self._links.get(peer)
                if link is None:
                    continue  # its link's comeback re-reads every queue end
                links = [link]
            counted = {queue: end for queue, end in ends.items() if end > 0}
            for link in links:
                if counted:
                    link.send(wire.Grew(tuple(counted), tuple(counted.values())))
                if ends:
                    link.send(wire.Wake(tuple(ends)))

    def refresh_soon(self) -> None:
        """Re-read the readers' queue ends and wake them, a moment from now (once, however
        often this is called meanwhile)."""
        if self._refresh is not None:
            return
        self._refresh = self._spawn(self._refresh_later())

    def refresh_due(self, now: float) -> bool:
        """Whether the last re-read is older than `PARTITION_REFRESH_INTERVAL`."""
        return now - self._refreshed_at >= PARTITION_REFRESH_INTERVAL

    async def _refresh_later(self) -> None:
        try:
            await asyncio.sleep(PEER_GONE_REFRESH_DELAY)
            await self._refresh_ends()
        finally:
            self._refresh = None
            self._refreshed_at = time.monotonic()

    def stop(self) -> None:
        """Send nothing more; cancel a pending re-read."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        self._pending.clear()
        if self._refresh is not None:
            self._refresh.cancel()
