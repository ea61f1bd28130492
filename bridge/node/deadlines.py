"""One timer for every client's deadline: the CONNECT that must come, the keepalive that must not
lapse.

A loop timer per connection (`loop.call_later`) costs about half a KiB of every idle connection:
uvloop's timer object and its libuv handle, the handle asyncio hands back, a context and a bound
method. A node holds tens of thousands of idle clients, so they share one. A deadline goes into
the bucket of `RESOLUTION` seconds that it falls in, rounded up; one loop timer is set for the
earliest bucket. A deadline is therefore kept no earlier than asked and at most `RESOLUTION`
later, and keeping or dropping one is a set operation.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from typing import Protocol

log = logging.getLogger("bridge.deadlines")

RESOLUTION = 0.25
"""Seconds per bucket: how late a deadline may be kept."""
NONE = -1
"""The bucket of no deadline."""


class Due(Protocol):
    """What has a deadline (`bridge.listeners.connection.Connection`)."""

    def deadline_due(self) -> None:
        """The deadline set with `Deadlines.add` has passed."""
        ...


class Deadlines:
    """The deadlines of one node's clients, on one loop timer."""

    __slots__ = ("_armed", "_buckets", "_firing", "_handle", "_keys")

    def __init__(self) -> None:
        self._buckets: dict[int, set[Due]] = {}
        self._keys: list[int] = []
        """A heap of bucket numbers; one whose bucket emptied stays until it comes up."""
        self._handle: asyncio.TimerHandle | None = None
        self._armed = NONE
        """The bucket the loop timer is set for."""
        self._firing = NONE
        """The last bucket being handled now, while `_fire` runs."""

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def add(self, item: Due, when: float) -> int:
        """Call `item.deadline_due()` once, no earlier than loop time `when`. Returns the bucket
        to `remove` it from."""
        key = max(math.ceil(when / RESOLUTION), self._firing + 1)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            heapq.heappush(self._keys, key)
            if self._firing == NONE and (self._handle is None or key < self._armed):
                self._arm(key)  # (while firing, `_fire` sets the timer when it is done)
        bucket.add(item)
        return key

    def remove(self, item: Due, key: int) -> int:
        """Drop the deadline `add` put in bucket `key` (nothing if it is gone already, or
        `key` is NONE). Returns NONE, to keep in place of the bucket."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.discard(item)
            if not bucket:
                del self._buckets[key]
        return NONE

    def close(self) -> None:
        """Drop every deadline and the loop timer (the node stops)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._buckets.clear()
        self._keys.clear()

    def _arm(self, key: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = key
        self._handle = asyncio.get_running_loop().call_at(key * RESOLUTION, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed = NONE
        keys = self._keys
        # A timer may fire a little before its time: what is due is what the clock says.
        self._firing = now = math.floor(asyncio.get_running_loop().time() / RESOLUTION)
        try:
            while keys and keys[0] <= now:
                bucket = self._buckets.pop(heapq.heappop(keys), None)
                for item in bucket or ():
                    try:
                        item.deadline_due()
                    except Exception:
                        log.exception("deadline of %r", item)
        finally:
            self._firing = NONE
            if keys:
                self._arm(keys[0])
