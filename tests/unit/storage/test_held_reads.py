"""`HeldReads`, the pulls the RocketMQ store holds at the ends of the parts its readers follow,
with a scripted broker: an answer becomes the kept batch and wakes the node, the pull is held
again after it, and no more parts are held, or remembered, than the limit."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from bridge.storage.base import Message, ReadResult, Stored
from bridge.storage.rocketmq.held import HeldReads
from bridge.storage.rocketmq.reads import LightQueuePulls, SharedReads


class Broker:
    """Holds every pull until a message is put on its part (`put`)."""

    def __init__(self) -> None:
        self.holds: list[tuple[str, int]] = []
        self.waiting: dict[str, asyncio.Future[ReadResult]] = {}
        self.arrivals: list[str] = []

    async def hold(self, part: str, offset: int, hold_ms: int, limit: int) -> ReadResult:
        self.holds.append((part, offset))
        future = self.waiting[part] = asyncio.get_running_loop().create_future()
        return await future

    def put(self, part: str, offset: int) -> None:
        message = Message("t/a", b"x", qos=1, key=f"k{offset}")
        stored = Stored(offset=offset, seq=offset, message=message, queues=(part,), size=4)
        self.waiting.pop(part).set_result(ReadResult([stored], offset + 1))

    def arrived(self, part: str) -> None:
        """The reads waiting for a dispatch of `part` are told (LightQueuePulls.arrived)."""
        self.arrivals.append(part)


def test_an_answer_is_kept_wakes_the_node_and_the_pull_is_held_again_after_it() -> None:
    async def main() -> None:
        broker = Broker()
        reads = SharedReads()
        woken: list[dict[str, int]] = []
        held = HeldReads(cast(LightQueuePulls, broker), reads, limit=10, on_arrival=woken.append)
        held.answered("g|q", 5)
        await asyncio.sleep(0)
        assert held.holds("g|q") and broker.holds == [("g|q", 5)]
        broker.put("g|q", 5)
        for _ in range(3):
            await asyncio.sleep(0)
        assert woken == [{"g|q": 6}]
        assert broker.arrivals == ["g|q"]
        kept = reads.read_kept("g|q", 5, 10)
        assert kept is not None and [s.offset for s in kept.messages] == [5]
        assert broker.holds == [("g|q", 5), ("g|q", 6)]
        held.close()

    asyncio.run(main())


def test_no_more_parts_are_held_or_remembered_than_the_limit() -> None:
    async def main() -> None:
        broker: Any = Broker()
        held = HeldReads(
            cast(LightQueuePulls, broker), SharedReads(), limit=2, on_arrival=lambda e: None
        )
        for i in range(5):
            held.answered(f"g|q{i}", 0)
        await asyncio.sleep(0)
        assert len(held) == 2 and [held.holds(f"g|q{i}") for i in range(5)] == [
            True,
            True,
            False,
            False,
            False,
        ]
        assert len(held._read_at) == 2
        held.close()
        assert len(held) == 0

    asyncio.run(main())
