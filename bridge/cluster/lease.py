"""A node's lease on its clients, so that no ClientId is served by two nodes at once.

A take-over asks the node holding the client to let it go over their link (`Release`). When that
node cannot be asked (the link is down, or it does not answer within `takeover_timeout`), the
taker used to serve the client all the same, while the holder, if its clients still reached
it, went on serving the old connection until it learnt of the claim: the nemesis saw one
ClientId answered by two nodes for up to a second. Two sides close that:

* **The holder** (`Lease`). Its heartbeat in Redis is its lease: others take it for alive until
  Redis's clock passes the heartbeat's expiry, which is at least `node_timeout` after the moment
  the node sent that heartbeat. A node that has not renewed it for `node_timeout` less a margin
  and lacks a link to some member (a taker it could not hear) stops serving: it closes its
  clients' connections and refuses new ones until a heartbeat goes through again. A node with a
  link to every member keeps serving through a Redis outage: any taker can ask it. A node that
  reaches Redis but lacks a link looks up its clients' owners at every heartbeat, and lets go of
  those another node claimed.
* **The taker** (`wait_for_holder`). A claim whose Release went unanswered is served only once
  the holder's heartbeat has lapsed (it has stopped serving, or died), or has been renewed after
  the claim (it looked up its clients' owners then, and let this one go), within
  `node_timeout` and a second.

Times on the holder's side are its monotonic clock; on the taker's side, Redis's clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

log = logging.getLogger("bridge.cluster")


def margin_of(node_timeout: float) -> float:
    """How long before its lease could lapse in Redis a cut-off node stops serving: a heartbeat
    period, and never less than half a second (clocks run at slightly different rates)."""
    return max(0.5, node_timeout / 3)


LAPSE_SLOP = 0.5
"""Seconds by which the lease may lapse in Redis before it would on this host's clock (the
two clocks run at slightly different rates; a heartbeat's own trip to Redis)."""


class Lease:
    """This node's side: when it must stop serving, and when it may serve again."""

    def __init__(self, node_timeout: float, now: float | None = None) -> None:
        self.node_timeout = node_timeout
        self.margin = margin_of(node_timeout)
        self.renewed_from = time.monotonic() if now is None else now
        """When the last heartbeat that went through was sent (monotonic)."""
        self.fenced = False
        """Serving stopped: the lease may have lapsed while a member could not reach us."""

    def renewed(self, sent: float, now: float | None = None) -> bool:
        """A heartbeat sent at `sent` went through. True if that ends a fence: only one sent
        recently enough does (one sent before a cut and answered after it leaves the lease as
        short as it was, and the fence would only start again)."""
        self.renewed_from = max(self.renewed_from, sent)
        now = time.monotonic() if now is None else now
        if not self.fenced or now >= self.renewed_from + self.node_timeout - self.margin:
            return False
        self.fenced = False
        return True

    def must_fence(self, now: float, cut_off: bool) -> bool:
        """Whether to stop serving now: the lease is about to lapse and some member cannot ask
        this node to let a client go. True once per fence."""
        if self.fenced or not cut_off:
            return False
        if now < self.renewed_from + self.node_timeout - self.margin:
            return False
        self.fenced = True
        return True

    def lapsed_meanwhile(self, now: float) -> bool:
        """After this process did not run for a while (`bridge.node.stalls`): whether its lease
        may have lapsed in Redis meanwhile, so that a taker may be serving one of its clients
        without having asked it. Then serving stops, as `must_fence` stops it (True once per
        fence). A shorter pause leaves the lease standing: a taker that asked meanwhile is
        answered now, and one that did not ask waits for the lapse. Judging by the margin
        instead stopped a node whose loop a busy machine had held up for 2.8 s."""
        if self.fenced or now < self.renewed_from + self.node_timeout - LAPSE_SLOP:
            return False
        self.fenced = True
        return True


class HolderLease(Protocol):
    """What the taker reads of the holder's lease (`RedisRegistry.lease_of`)."""

    async def lease_of(self, node_id: str) -> tuple[int | None, int]:
        """(the holder's heartbeat expiry, Redis's clock now), in ms; None: no heartbeat."""
        ...


async def wait_for_holder(
    registry: HolderLease, holder: str, client_id: str, node_timeout: float, poll: float = 0.2
) -> bool:
    """After a Release `holder` did not answer: wait until its lease has lapsed or has been
    renewed since (see the module docstring), for at most `node_timeout` + 1 s. True if one of
    them was seen; False if the time ran out (or Redis could not be read), and the caller
    serves the client anyway, as it did before leases."""
    deadline = time.monotonic() + node_timeout + 1.0
    first: int | None = None
    while time.monotonic() < deadline:
        try:
            expiry, now = await registry.lease_of(holder)
        except Exception as exc:  # a Redis or connection error: look again
            log.debug("client %s: lease of %s not read: %r", client_id, holder, exc)
            await asyncio.sleep(poll)
            continue
        if expiry is None or expiry < now:
            return True  # lapsed: the holder stopped serving, or died
        if first is None:
            first = expiry
        elif expiry > first:
            await asyncio.sleep(poll)  # it renewed, then looked up its clients: let it act
            return True
        await asyncio.sleep(poll)
    log.warning(
        "client %s: node %s neither answered nor lost its lease within %.0f s; served here",
        client_id,
        holder,
        node_timeout + 1.0,
    )
    return False
