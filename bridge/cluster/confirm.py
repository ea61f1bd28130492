"""Peers confirming new interest, so that a SUBACK means the cluster knows the filter.

A node that announced new interest for a SUBSCRIBE (`AddFilters`, `SharedMember`) asks every
peer it has an up link to for a confirmation: it sends `Confirm(token)` after the interest
frames, and a peer answers `Confirmed(token)` when it reads it. A link is an ordered stream and
a node applies interest frames as it reads them, so the answer means the peer routes by the new
interest: a PUBLISH that reaches it after the SUBACK is routed to the new subscriber.

The wait is bounded by `interest_confirm_timeout`: a peer that has not answered by then is
handled as a lost link (the link is closed; the dialer reconnects, both sides replay their
interest, and the announcer re-reads what the peer may have stored meanwhile), and the SUBACK
goes out. The SUBSCRIBEs of one event-loop turn share one `Confirm` per link. With no link up
(a single node) nothing is sent and nothing waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from bridge.cluster import wire


class Link(Protocol):
    """What confirmations use of a peer link (`bridge.cluster.peers.PeerLink`)."""

    @property
    def closed(self) -> bool:
        """Whether the link is closed (or closing)."""
        ...

    def send(self, frame: wire.Frame) -> None:
        """Write a frame on the link."""
        ...

    def close(self, reason: str) -> None:
        """Close the link, logging why (its loss is then handled as any lost link's)."""
        ...


class _Round:
    """One `Confirm` token: the links that have not answered it yet, and who waits."""

    __slots__ = ("timer", "token", "waiters", "waiting")

    def __init__(self, token: int) -> None:
        self.token = token
        self.waiters: list[asyncio.Future[None]] = []
        """One future per SUBSCRIBE (so that one cancelled waiter cancels no other)."""
        self.waiting: set[Link] = set()
        self.timer: asyncio.TimerHandle | None = None


class Confirmations:
    """The confirmations this node waits for from its peers (module docstring)."""

    def __init__(
        self, links: Mapping[str, Link], timeout: float, count: Callable[[str], None]
    ) -> None:
        self.links = links
        """Peer node -> its up link (the membership's own table)."""
        self.timeout = timeout
        """Seconds a peer may take to confirm (`interest_confirm_timeout`; 0: nobody waits)."""
        self.count = count
        self._next_token = 1
        self._open: _Round | None = None
        """The round the SUBSCRIBEs of this loop turn join; its `Confirm`s go out next turn."""
        self._rounds: dict[int, _Round] = {}
        """Rounds sent and not finished, by token."""

    def confirm(self) -> asyncio.Future[None] | None:
        """A future done once every up link confirmed the interest announced so far (or failed
        to in time and was closed); None when there is nothing to wait for (no link up)."""
        if not self.links or self.timeout <= 0:
            return None
        loop = asyncio.get_running_loop()
        if self._open is None:
            self._open = _Round(self._next_token)
            self._next_token += 1
            loop.call_soon(self._send)
        done: asyncio.Future[None] = loop.create_future()
        self._open.waiters.append(done)
        return done

    def _send(self) -> None:
        confirm = self._open
        if confirm is None:
            return  # the node stopped meanwhile
        self._open = None
        for link in self.links.values():
            if not link.closed:
                link.send(wire.Confirm(confirm.token))
                confirm.waiting.add(link)
        if not confirm.waiting:
            self._finish(confirm)
            return
        self._rounds[confirm.token] = confirm
        confirm.timer = asyncio.get_running_loop().call_later(self.timeout, self._expired, confirm)

    def confirmed(self, link: Link, token: int) -> None:
        """`link`'s peer answered `Confirmed(token)`."""
        confirm = self._rounds.get(token)
        if confirm is not None:
            confirm.waiting.discard(link)
            if not confirm.waiting:
                self._finish(confirm)

    def link_lost(self, link: Link) -> None:
        """`link` is down or replaced: its peer gets a replay on its next link, so nothing is
        waited for from it any more."""
        for confirm in list(self._rounds.values()):
            confirm.waiting.discard(link)
            if not confirm.waiting:
                self._finish(confirm)

    def _expired(self, confirm: _Round) -> None:
        for link in list(confirm.waiting):
            if not link.closed:
                self.count("peer_confirm_timeouts")
                link.close(f"did not confirm interest within {self.timeout:g} s")
        self._finish(confirm)

    def _finish(self, confirm: _Round) -> None:
        self._rounds.pop(confirm.token, None)
        if confirm.timer is not None:
            confirm.timer.cancel()
        for done in confirm.waiters:
            if not done.done():
                done.set_result(None)

    def stop(self) -> None:
        """The node leaves: nobody waits any more."""
        if self._open is not None:
            self._finish(self._open)
            self._open = None
        for confirm in list(self._rounds.values()):
            self._finish(confirm)
