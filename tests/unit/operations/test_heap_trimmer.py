"""HeapTrimmer: freed heap memory goes back to the system after traffic, not while idle."""

from __future__ import annotations

import asyncio
import os

import pytest

from bridge.operations.memory import HeapTrimmer, _malloc_trim

pytestmark = pytest.mark.skipif(
    _malloc_trim() is None and not os.environ.get("CI"),
    reason="no glibc malloc_trim here (musl); never skipped in CI, which runs on glibc",
)


def test_the_heap_is_trimmed_once_per_interval_with_traffic_and_never_while_idle() -> None:
    moved = [0]

    async def scenario() -> HeapTrimmer:
        trimmer = HeapTrimmer(0.02, lambda: moved[0])
        trimmer.start()
        await asyncio.sleep(0.15)  # idle: nothing moved
        assert trimmer.trims == 0
        moved[0] += 1000
        await asyncio.sleep(0.05)  # one interval (or two) sees the change, once
        assert trimmer.trims == 1
        await asyncio.sleep(0.1)
        assert trimmer.trims == 1
        await trimmer.stop()
        moved[0] += 1000
        await asyncio.sleep(0.05)
        return trimmer

    assert asyncio.run(scenario()).trims == 1  # stopped: no more trims


def test_an_interval_of_zero_never_trims() -> None:
    async def scenario() -> HeapTrimmer:
        count = iter(range(1_000_000))
        trimmer = HeapTrimmer(0, lambda: next(count))
        trimmer.start()
        await asyncio.sleep(0.05)
        await trimmer.stop()
        return trimmer

    assert asyncio.run(scenario()).trims == 0
