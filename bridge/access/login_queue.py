"""The queue of password checks: bounded, and fair across the addresses the logins come from.

A password check costs tens of milliseconds of Argon2 or scrypt on a small thread pool
(`AccessControl`); a flood of logins from one address must neither queue without bound nor make
the logins of other addresses wait behind it. `FairQueue` is the pure rule: at most `max_total`
checks wait, at most `max_per_source` of them from one address, and a free slot goes to the
addresses in turn (round-robin), not to whoever queued first. `LoginQueue` applies it to the
pool: a check runs at once while a worker is free, else waits its turn, else is refused at once
with `LoginsBusy` (the CONNECT is answered "server busy": CONNACK 0x89, 3.1.1: 3).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

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


class LoginQueue:
    """Runs password checks on `pool` with at most `workers` at once; the rest wait in a
    `FairQueue` (`login_queue`, `login_queue_per_address`) or are refused with `LoginsBusy`."""

    def __init__(self, pool: Executor, workers: int, max_total: int, max_per_source: int) -> None:
        self.pool = pool
        self.workers = workers
        self.running = 0
        """Checks on the pool now (at most `workers`)."""
        self.queue: FairQueue[asyncio.Future[None]] = FairQueue(max_total, max_per_source)

    async def run(
        self, source: str, check: Callable[..., T], *args: Any, wanted: Callable[[], bool] | None
    ) -> T:
        """`check(*args)` on the pool once it is `source`'s turn. Raises LoginsBusy if the
        queue is full, or if `wanted()` says the check is no longer needed when its turn comes
        (its client left: the slot goes to the next one)."""
        await self._turn(source)
        try:
            if wanted is not None and not wanted():
                raise LoginsBusy("the client left while its password check waited")
            return await asyncio.get_running_loop().run_in_executor(self.pool, check, *args)
        finally:
            self._done()

    async def _turn(self, source: str) -> None:
        """Wait for a worker; return holding it."""
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
                self._done()  # the turn came as we were cancelled: hand it on
            raise

    def _done(self) -> None:
        """A worker is free: give it to the next waiting check, in turn."""
        self.running -= 1
        while (ticket := self.queue.take()) is not None:
            if not ticket.done():
                self.running += 1
                ticket.set_result(None)
                return
