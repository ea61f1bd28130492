"""`Confirmations`: a SUBSCRIBE's wait for its peers, on links that record what they are sent.

The end-to-end behaviour (a publish on another node right after the SUBACK arrives; a frozen
peer's link dropped) is tested between real nodes in tests/cluster/test_suback_confirmed.py."""

from __future__ import annotations

import asyncio
from collections import Counter

from bridge.cluster import wire
from bridge.cluster.confirm import Confirmations


class RecordingLink:
    """A peer link that keeps what it is sent and whether it was closed, and why."""

    def __init__(self) -> None:
        self.sent: list[wire.Frame] = []
        self.closed = False
        self.reason = ""

    def send(self, frame: wire.Frame) -> None:
        self.sent.append(frame)

    def close(self, reason: str) -> None:
        self.closed = True
        self.reason = reason

    def token(self) -> int:
        (confirm,) = self.sent
        assert isinstance(confirm, wire.Confirm)
        return confirm.token


def confirmations(
    links: dict[str, RecordingLink], timeout: float = 5.0
) -> tuple[Confirmations, Counter[str]]:
    counts: Counter[str] = Counter()
    return Confirmations(links, timeout, lambda name: counts.update((name,))), counts


def test_without_a_linked_peer_nothing_waits_and_nothing_is_sent() -> None:
    async def run() -> None:
        waits, _ = confirmations({})
        assert waits.confirm() is None
        linked = RecordingLink()
        off, _ = confirmations({"b": linked}, timeout=0)
        assert off.confirm() is None
        await asyncio.sleep(0)
        assert linked.sent == []

    asyncio.run(run())


def test_the_subscribes_of_one_loop_turn_share_one_confirm_per_link_and_end_when_all_answer() -> (
    None
):
    async def run() -> None:
        b, c = RecordingLink(), RecordingLink()
        waits, _ = confirmations({"b": b, "c": c})
        first, second = waits.confirm(), waits.confirm()
        assert first is not None and second is not None
        await asyncio.sleep(0)
        token = b.token()
        assert c.token() == token
        waits.confirmed(b, token)
        await asyncio.sleep(0)
        assert not first.done()
        waits.confirmed(c, token)
        assert first.done() and second.done()
        later = waits.confirm()
        await asyncio.sleep(0)
        assert later is not None and b.sent[-1] == wire.Confirm(token + 1)

    asyncio.run(run())


def test_a_lost_link_is_not_waited_for() -> None:
    async def run() -> None:
        b, c = RecordingLink(), RecordingLink()
        waits, _ = confirmations({"b": b, "c": c})
        done = waits.confirm()
        assert done is not None
        await asyncio.sleep(0)
        waits.confirmed(b, b.token())
        waits.link_lost(c)
        assert done.done() and not c.closed

    asyncio.run(run())


def test_a_peer_that_does_not_answer_in_time_has_its_link_closed_and_the_wait_ends() -> None:
    async def run() -> None:
        b, c = RecordingLink(), RecordingLink()
        waits, counts = confirmations({"b": b, "c": c}, timeout=0.01)
        done = waits.confirm()
        assert done is not None
        await asyncio.sleep(0)
        waits.confirmed(b, b.token())
        await asyncio.wait_for(done, 5)
        assert not b.closed
        assert c.closed and c.reason == "did not confirm interest within 0.01 s"
        assert counts == {"peer_confirm_timeouts": 1}

    asyncio.run(run())


def test_one_cancelled_subscribe_does_not_cancel_the_others_wait() -> None:
    async def run() -> None:
        b = RecordingLink()
        waits, _ = confirmations({"b": b})
        cancelled, kept = waits.confirm(), waits.confirm()
        assert cancelled is not None and kept is not None
        cancelled.cancel()
        await asyncio.sleep(0)
        waits.confirmed(b, b.token())
        assert kept.done() and not kept.cancelled()

    asyncio.run(run())


def test_an_answer_for_an_unknown_token_is_ignored() -> None:
    async def run() -> None:
        b = RecordingLink()
        waits, _ = confirmations({"b": b})
        done = waits.confirm()
        assert done is not None
        await asyncio.sleep(0)
        waits.confirmed(b, b.token() + 7)
        assert not done.done()
        waits.stop()
        assert done.done()

    asyncio.run(run())
