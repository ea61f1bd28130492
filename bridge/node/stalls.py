"""Noticing that this process stopped running for a while, before acting on what waited meanwhile.

A process can stop without dying: SIGSTOP, a virtual machine paused by its host, a machine
swapping hard. Nothing can be asked of it meanwhile, and a cluster member judges by its lease
(`bridge.cluster.lease`) that it may have stopped serving and takes its clients over. When it
runs again, the loop's first turn hands it everything that arrived in the pause: a client's
PINGREQ, a PUBLISH, a message pulled from the store for a subscriber. Those input and output
callbacks run before any timer of that turn, so a check made by a timer (the cluster's link
keeper) comes too late: the nemesis saw a resumed node answer a PINGREQ 50 ms after another
node had accepted that client.

So the cluster's link keeper `tick`s this watch every half second, and every connection asks
it (one comparison) before it handles what it read and before it writes: a gap longer than
`limit` since the last tick is a stall, and the cluster decides then, before anything is
answered, whether this node may still serve (`Cluster.after_stall`). Outside a cluster
`limit` is infinite and nothing is ever asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class StallWatch:
    """When the loop last turned on time, and whom to ask after it did not."""

    __slots__ = ("limit", "on_stall", "ticked")

    def __init__(self) -> None:
        self.ticked = 0.0
        """The loop time of the last tick."""
        self.limit = math.inf
        """A gap since the last tick longer than this (seconds) is a stall."""
        self.on_stall: Callable[[float], bool] | None = None
        """Told the gap (seconds); True if this node stopped serving (every client closed)."""

    def watch(self, now: float, limit: float, on_stall: Callable[[float], bool]) -> None:
        """Start watching: gaps longer than `limit` are told to `on_stall`."""
        self.ticked = now
        self.limit = limit
        self.on_stall = on_stall

    def tick(self, now: float) -> None:
        """The loop turned on time (a timer of a known period ran)."""
        self.ticked = now

    def turned(self, now: float) -> None:
        """The ticking timer ran (`now`): a tick, or, late by more than `limit` with no
        connection having noticed yet, a stall told as one."""
        if now - self.ticked > self.limit:
            self.stalled(now)
        else:
            self.tick(now)

    def stalled(self, now: float) -> bool:
        """Called when `now - ticked > limit`. True if this node stopped serving: the caller
        must not act on what it read or write what it queued."""
        gap = now - self.ticked
        self.ticked = now  # one question per stall, however many connections notice it
        on_stall = self.on_stall
        return on_stall is not None and on_stall(gap)
