"""The one timer behind every client's CONNECT and keepalive deadline (`bridge.node.deadlines`),
on a real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from bridge.node.deadlines import RESOLUTION, Deadlines

WAIT = 5.0
"""How long a test waits for a deadline that must come (it comes within RESOLUTION)."""


class Client:
    """Something with a deadline: records the loop time it was told, and what to do then."""

    def __init__(self, name: str, then: Callable[[Client], None] | None = None) -> None:
        self.name = name
        self.due_at: list[float] = []
        self.then = then
        self.told = asyncio.Event()

    def deadline_due(self) -> None:
        self.due_at.append(asyncio.get_running_loop().time())
        self.told.set()
        if self.then is not None:
            self.then(self)


def run(test: Callable[[asyncio.AbstractEventLoop, Deadlines], Awaitable[None]]) -> None:
    async def main() -> None:
        deadlines = Deadlines()
        try:
            await test(asyncio.get_running_loop(), deadlines)
        finally:
            deadlines.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_deadline_is_kept_once_and_never_before_its_time() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        client = Client("a")
        when = loop.time() + 0.1
        deadlines.add(client, when)
        await asyncio.wait_for(client.told.wait(), WAIT)
        await asyncio.sleep(2 * RESOLUTION)
        assert len(client.due_at) == 1
        assert client.due_at[0] >= when
        assert len(deadlines) == 0

    run(test)


def test_a_removed_deadline_is_never_kept() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        gone, kept = Client("gone"), Client("kept")
        key = deadlines.add(gone, loop.time() + 0.05)
        deadlines.add(kept, loop.time() + 0.05)
        deadlines.remove(gone, key)
        deadlines.remove(gone, key)  # twice, or after it was kept: nothing happens
        await asyncio.wait_for(kept.told.wait(), WAIT)
        await asyncio.sleep(2 * RESOLUTION)
        assert gone.due_at == []

    run(test)


def test_deadlines_are_kept_in_the_order_of_their_times_whatever_the_order_they_came_in() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        order: list[str] = []
        start = loop.time()
        clients = {
            name: Client(name, lambda c: order.append(c.name))
            for name in ("late", "early", "middle")
        }
        deadlines.add(clients["late"], start + 3 * RESOLUTION)
        deadlines.add(clients["early"], start + 0.01)
        deadlines.add(clients["middle"], start + 2 * RESOLUTION)
        await asyncio.wait_for(clients["late"].told.wait(), WAIT)
        assert order == ["early", "middle", "late"]
        for name, offset in (("early", 0.01), ("middle", 2 * RESOLUTION), ("late", 3 * RESOLUTION)):
            assert clients[name].due_at[0] >= start + offset

    run(test)


def test_an_earlier_deadline_does_not_wait_for_a_later_one_set_before_it() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        later, earlier = Client("later"), Client("earlier")
        deadlines.add(later, loop.time() + 60)
        deadlines.add(earlier, loop.time() + 0.05)
        await asyncio.wait_for(earlier.told.wait(), WAIT)
        assert later.due_at == []
        assert len(deadlines) == 1

    run(test)


def test_a_deadline_set_again_when_it_is_kept_comes_once_more_in_a_later_pass() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        # What a keepalive does when the client was heard from meanwhile: a new deadline,
        # here one already past, which must not be kept in the same pass all the same.
        turns = [0]
        turn_at_call: list[int] = []

        def again(client: Client) -> None:
            turn_at_call.append(turns[0])
            loop.call_soon(lambda: turns.__setitem__(0, turns[0] + 1))  # runs after this pass
            if len(client.due_at) < 3:
                deadlines.add(client, loop.time() - 1.0)

        client = Client("again", again)
        deadlines.add(client, loop.time() + 0.01)
        for _ in range(100):
            if len(client.due_at) == 3:
                break
            await asyncio.sleep(RESOLUTION)
        assert len(client.due_at) == 3
        assert turn_at_call[0] < turn_at_call[1] < turn_at_call[2]

    run(test)


def test_a_failing_client_does_not_keep_the_others_from_their_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(client: Client) -> None:
        raise RuntimeError(f"{client.name} broke")

    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        broken, fine = Client("broken", fail), Client("fine")
        deadlines.add(broken, loop.time() + 0.01)
        deadlines.add(fine, loop.time() + 0.01)
        await asyncio.wait_for(fine.told.wait(), WAIT)
        assert broken.due_at

    run(test)
    assert "broken broke" in caplog.text


def test_close_drops_every_deadline() -> None:
    async def test(loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        client = Client("dropped")
        deadlines.add(client, loop.time() + 0.05)
        deadlines.close()
        await asyncio.sleep(0.05 + 2 * RESOLUTION)
        assert client.due_at == []
        assert len(deadlines) == 0

    run(test)
