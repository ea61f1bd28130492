"""Readers of one light queue on a node share its pulls (`SharedReads`), with a scripted broker:
one pull per (queue, offset) at a time, the last batch kept, failures and cancellations passed
on to the readers that joined, and the kept batches bounded in bytes."""

from __future__ import annotations

import asyncio

import pytest

from bridge.storage.base import Message, ReadResult, Stored, StoreUnavailable
from bridge.storage.rocketmq.reads import SharedReads


def _stored(offset: int, size: int = 10) -> Stored:
    message = Message("t/a", b"x" * (size - 3), qos=1, key=f"k{offset}")
    return Stored(offset=offset, seq=1000 + offset, message=message, queues=("f:t/#",), size=size)


class Broker:
    """Answers pulls from a queue of `end` messages, after `gate` is set."""

    def __init__(self, end: int = 100) -> None:
        self.end = end
        self.pulls: list[tuple[str, int, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: BaseException | None = None

    async def pull(self, queue: str, offset: int, limit: int) -> ReadResult:
        self.pulls.append((queue, offset, limit))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        messages = [_stored(o) for o in range(offset, min(offset + limit, self.end))]
        return ReadResult(messages, messages[-1].offset + 1 if messages else offset)


def test_readers_of_one_queue_at_one_offset_share_one_pull_each_getting_its_limit() -> None:
    async def main() -> None:
        broker = Broker()
        reads = SharedReads(pull_size=32)
        broker.gate.clear()
        tasks = [
            asyncio.create_task(reads.read("f:t/#", 0, limit, broker.pull)) for limit in (8, 32, 4)
        ]
        await asyncio.sleep(0)
        broker.gate.set()
        results = await asyncio.gather(*tasks)
        assert broker.pulls == [("f:t/#", 0, 32)]
        assert [[m.offset for m in r.messages] for r in results] == [
            list(range(8)),
            list(range(32)),
            list(range(4)),
        ]
        assert [r.next_offset for r in results] == [8, 32, 4]
        # A reader coming later, or one reading on from where it stopped, uses the kept batch.
        later = await reads.read("f:t/#", 8, 16, broker.pull)
        assert [m.offset for m in later.messages] == list(range(8, 24))
        assert len(broker.pulls) == 1
        # Past the kept batch: a pull of its own; another queue: a pull of its own.
        await reads.read("f:t/#", 32, 8, broker.pull)
        await reads.read("f:u/#", 0, 8, broker.pull)
        assert broker.pulls[1:] == [("f:t/#", 32, 32), ("f:u/#", 0, 32)]
        assert reads.stats == {"pulls": 3, "joined": 2, "kept_hits": 1}

    asyncio.run(main())


def test_a_failed_pull_fails_every_reader_that_joined_it_and_is_not_kept() -> None:
    async def main() -> None:
        broker = Broker()
        reads = SharedReads()
        broker.gate.clear()
        broker.fail = StoreUnavailable("broker down")
        tasks = [asyncio.create_task(reads.read("q", 0, 8, broker.pull)) for _ in range(3)]
        await asyncio.sleep(0)
        broker.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, StoreUnavailable) for r in results)
        broker.fail = None
        again = await reads.read("q", 0, 8, broker.pull)
        assert len(again.messages) == 8 and len(broker.pulls) == 2

    asyncio.run(main())


def test_a_reader_whose_shared_pull_was_cancelled_with_its_puller_reads_again_itself() -> None:
    async def main() -> None:
        broker = Broker()
        reads = SharedReads()
        broker.gate.clear()
        puller = asyncio.create_task(reads.read("q", 0, 8, broker.pull))
        await asyncio.sleep(0)
        joiner = asyncio.create_task(reads.read("q", 0, 8, broker.pull))
        await asyncio.sleep(0)
        puller.cancel()  # its client disconnected
        await asyncio.sleep(0)
        broker.gate.set()
        result = await joiner
        assert [m.offset for m in result.messages] == list(range(8))
        assert puller.cancelled()
        assert len(broker.pulls) == 2

    asyncio.run(main())


def test_what_retention_removed_is_passed_on_and_never_kept() -> None:
    async def main() -> None:
        calls = []

        async def pull(queue: str, offset: int, limit: int) -> ReadResult:
            calls.append(offset)
            return ReadResult([_stored(5)], 6, lost=5)

        reads = SharedReads()
        first = await reads.read("q", 0, 8, pull)
        assert first.lost == 5 and first.next_offset == 6
        await reads.read("q", 0, 8, pull)
        assert calls == [0, 0]

    asyncio.run(main())


@pytest.mark.parametrize("queues", [3, 10])
def test_kept_batches_stay_within_their_byte_bound_least_recently_used_dropped(
    queues: int,
) -> None:
    async def main() -> None:
        broker = Broker()
        reads = SharedReads(pull_size=10, max_kept_bytes=250)  # 10 messages of 10 bytes each
        for q in range(queues):
            await reads.read(f"q{q}", 0, 10, broker.pull)
            assert reads.kept_bytes <= 250
        pulls = len(broker.pulls)
        await reads.read(f"q{queues - 1}", 0, 10, broker.pull)  # the newest is kept
        assert len(broker.pulls) == pulls
        await reads.read("q0", 0, 10, broker.pull)  # the oldest was dropped (with > 2 queues)
        assert len(broker.pulls) == pulls + 1

    asyncio.run(main())
