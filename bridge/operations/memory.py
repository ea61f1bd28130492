"""Handing freed heap memory back to the system after traffic: `HeapTrimmer`.

A burst leaves the C heap larger than what stays in use: a slow subscriber's socket buffer, the
joined writes of a fan-out, a backlog read from disk. The blocks are freed, but glibc keeps their
pages in the process (they count in its RSS) until `malloc_trim` hands them back. A node trims
every `memory_trim_interval` seconds when bytes moved since its last trim: about 0.2-0.5 ms for
a heap of 40 MiB; after the users' QoS 0 load of the benchmarks the heap went from 14.1 to 4.3 MiB
(docs/performance/2026-11-26-one-node-passes-1-2.md, "Resident memory").

Without glibc (musl has no malloc_trim) it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class HeapTrimmer:
    """Trims the C heap every `interval` seconds if `moved()` (a count of bytes the node sent and
    received) changed since the last trim."""

    def __init__(self, interval: float, moved: Callable[[], int]) -> None:
        self.interval = interval
        self.moved = moved
        self.trims = 0
        self._trim = _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval > 0 and self._trim is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        trim = self._trim
        assert trim is not None
        last = self.moved()
        while True:
            await asyncio.sleep(self.interval)
            now = self.moved()
            if now != last:
                last = now
                trim(0)
                self.trims += 1
