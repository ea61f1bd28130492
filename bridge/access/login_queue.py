"""The queue of password checks: bounded, and fair across the addresses the logins come from.

A password check costs tens of milliseconds of Argon2 or scrypt on a small thread pool
(`AccessControl`); a flood of logins from one address must neither queue without bound nor make
the logins of other addresses wait behind it. `FairQueue` is the pure rule: at most `max_total`
checks wait, at most `max_per_source` of them from one address, and a free slot goes to the
addresses in turn (round-robin), not to whoever queued first. A `Lane` applies it to a pool: a
check runs at once while a worker is free, else waits its turn, else is refused at once with
`LoginsBusy` (the CONNECT is answered "server busy": CONNACK 0x89, 3.1.1: 3).

`LoginQueue` has two lanes. An address whose logins failed lately is *failing*
(`bridge.access.login_guard.FailedLogins`): its checks take the failing lane, whose threads the
OS runs last (`lowest_cpu_priority`); a check that waited in the other lane while its address
failed moves to the failing lane when its turn comes. The other addresses' checks never wait
behind a failing one for a worker, nor share the cores with its hashes: a client logs in at its
usual pace while another address floods the node with wrong passwords, and the flood's hashes
run on what CPU is left (when none is, its checks wait and the rest are refused busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from bridge.access.login_guard import FailedLogins

T = TypeVar("T")


class LoginsBusy(Exception):
    """The check was not run: the queue is full (or the client left while it waited); the
    message says which limit."""


class FairQueue(Generic[T]):
    """Items waiting by source, bounded overall and per source, taken round-robin across
    sources (in each source's order). No I/O, no clock."""

    __slots__ = ("_sources", "_total", "max_per_source", "max_total")

    def __init__(self, max_total: int, max_per_source: int) -> None:
        self.max_total = max_total
        """Items waiting at most, over all sources."""
        self.max_per_source = max_per_source
        """Items waiting at most from one source (0: only `max_total` bounds a source)."""
        self._sources: dict[str, deque[T]] = {}
        """Each source's items, sources in the order their turn comes."""
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def waiting(self, source: str) -> int:
        """How many items of `source` wait."""
        items = self._sources.get(source)
        return 0 if items is None else len(items)

    def refusal(self, source: str) -> str | None:
        """Why an item of `source` would not be taken now (None: it would)."""
        if self._total >= self.max_total:
            return f"{self._total} password checks wait (login_queue={self.max_total})"
        if self.max_per_source and self.waiting(source) >= self.max_per_source:
            return (
                f"{self.max_per_source} password checks from this address wait "
                f"(login_queue_per_address={self.max_per_source})"
            )
        return None

    def offer(self, source: str, item: T) -> bool:
        """Queue `item` of `source`; False (nothing queued) when a bound is reached."""
        if self.refusal(source) is not None:
            return False
        items = self._sources.get(source)
        if items is None:
            items = self._sources[source] = deque()
        items.append(item)
        self._total += 1
        return True

    def take(self) -> T | None:
        """The next item: the oldest of the source whose turn it is (None: nothing waits).
        That source's turn then comes again after every other waiting source's."""
        sources = self._sources
        if not sources:
            return None
        source = next(iter(sources))
        items = sources.pop(source)
        item = items.popleft()
        if items:
            sources[source] = items  # to the back of the round
        self._total -= 1
        return item

    def discard(self, source: str, item: T) -> bool:
        """Take `item` out of the queue (its client left); False if it was not waiting."""
        items = self._sources.get(source)
        if items is None or item not in items:
            return False
        items.remove(item)
        if not items:
            del self._sources[source]
        self._total -= 1
        return True


class Lane:
    """Password checks on one pool, at most `workers` at once; the rest wait in a `FairQueue`
    (`login_queue`, `login_queue_per_address`) or are refused with `LoginsBusy`."""

    __slots__ = ("pool", "queue", "running", "workers")

    def __init__(self, pool: Executor, workers: int, max_total: int, max_per_source: int) -> None:
        self.pool = pool
        self.workers = workers
        self.running = 0
        """Checks on the pool now (at most `workers`)."""
        self.queue: FairQueue[asyncio.Future[None]] = FairQueue(max_total, max_per_source)

    async def turn(self, source: str) -> None:
        """Wait for a worker; return holding it (`done` gives it back)."""
        if self.running < self.workers and not len(self.queue):
            self.running += 1
            return
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.queue.offer(source, ticket):
            raise LoginsBusy(self.queue.refusal(source) or "the login queue is full")
        try:
            await ticket
        except asyncio.CancelledError:
            if not self.queue.discard(source, ticket) and ticket.done() and not ticket.cancelled():
                self.done()  # the turn came as we were cancelled: hand it on
            raise

    def done(self) -> None:
        """A worker is free: give it to the next waiting check, in turn."""
        self.running -= 1
        while (ticket := self.queue.take()) is not None:
            if not ticket.done():
                self.running += 1
                ticket.set_result(None)
                return


class LoginQueue:
    """Runs each password check in its lane: `lane` for addresses that did not fail lately,
    `failing_lane` for those that did (as `failed_logins` says)."""

    def __init__(self, lane: Lane, failing_lane: Lane, failed_logins: FailedLogins) -> None:
        self.lane = lane
        self.failing_lane = failing_lane
        self.failed_logins = failed_logins

    async def run(
        self, source: str, check: Callable[..., T], *args: Any, wanted: Callable[[], bool] | None
    ) -> T:
        """`check(*args)` on its lane's pool once it is `source`'s turn. Raises LoginsBusy if the
        lane's queue is full, or if `wanted()` says the check is no longer needed when its turn
        comes (its client left: the slot goes to the next one)."""
        loop = asyncio.get_running_loop()
        failing = self.failed_logins.failing
        lane = self.failing_lane if failing(source, loop.time()) else self.lane
        await lane.turn(source)
        if lane is self.lane and failing(source, loop.time()):
            # Its address failed while it waited: the worker goes to the next check, this one
            # waits in the failing lane.
            lane.done()
            lane = self.failing_lane
            await lane.turn(source)
        try:
            if wanted is not None and not wanted():
                raise LoginsBusy("the client left while its password check waited")
            return await loop.run_in_executor(lane.pool, check, *args)
        finally:
            lane.done()


def lowest_cpu_priority() -> None:
    """Make the calling thread the one the OS runs last (nice 19), where threads have a
    priority of their own (Linux); elsewhere, or if refused, it keeps its priority."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
