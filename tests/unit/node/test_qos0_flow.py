"""Which QoS 0 publishers wait for which subscribers (`bridge.node.qos0_flow`), on links that only
record what they were told."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bridge.config import Config
from bridge.counters import Metrics
from bridge.node.flow import PAUSED_BY_SUBSCRIBER
from bridge.node.qos0_flow import DROP, SEND, Qos0Flow

FULL = 300_000
"""A socket buffer over the high-water mark, under `write_buffer_high`."""


@dataclass(eq=False)
class Link:
    client_id: str
    peer: str = "127.0.0.1:1"
    closed: bool = False
    pauses: int = 0
    calls: list[str] = field(default_factory=list)

    def hold_reading(self, reason: int) -> None:
        assert reason == PAUSED_BY_SUBSCRIBER
        self.pauses |= reason
        self.calls.append("hold")

    def release_reading(self, reason: int) -> None:
        assert reason == PAUSED_BY_SUBSCRIBER
        self.pauses &= ~reason
        self.calls.append("release")

    def close(self, reason: str, **_: object) -> None:
        self.closed = True
        self.calls.append(f"close: {reason}")

    @property
    def reading(self) -> bool:
        return not self.pauses


def flow_of(*links: Link, **settings: object) -> tuple[Qos0Flow, Metrics]:
    metrics = Metrics()
    config = Config(**{"qos0_publisher_wait": 0.05, "write_buffer_high": 1_000_000, **settings})
    flow = Qos0Flow(
        config=config, metrics=metrics, connections={link.client_id: link for link in links}
    )
    return flow, metrics


def test_a_publisher_feeding_a_full_subscriber_stops_being_read_until_it_drains() -> None:
    async def scenario() -> None:
        pub, sub = Link("pub"), Link("sub")
        flow, metrics = flow_of(pub, sub)
        assert flow.when_full(sub, "pub", FULL) == SEND  # sent: the publisher waits instead
        assert not pub.reading and flow.waiting == 1
        assert flow.when_full(sub, "pub", FULL) == SEND  # a second message: still one wait
        assert pub.calls == ["hold"]
        flow.drained(sub)
        assert pub.reading and flow.waiting == 0
        assert metrics.get("qos0_publisher_waits") == 1
        await asyncio.sleep(0.1)  # the wait's end was cancelled: nothing more happens
        assert pub.calls == ["hold", "release"]
        assert metrics.get("qos0_subscribers_stuck") == 0

    asyncio.run(scenario())


def test_a_publisher_waits_for_every_full_subscriber_it_feeds() -> None:
    async def scenario() -> None:
        pub, one, two = Link("pub"), Link("one"), Link("two")
        flow, _ = flow_of(pub, one, two)
        flow.when_full(one, "pub", FULL)
        flow.when_full(two, "pub", FULL)
        flow.drained(one)
        assert not pub.reading, "two has not drained yet"
        flow.drained(two)
        assert pub.reading

    asyncio.run(scenario())


def test_every_publisher_of_a_full_subscriber_reads_on_when_it_drains() -> None:
    async def scenario() -> None:
        a, b, sub = Link("a"), Link("b"), Link("sub")
        flow, _ = flow_of(a, b, sub)
        flow.when_full(sub, "a", FULL)
        flow.when_full(sub, "b", FULL)
        assert not a.reading and not b.reading
        flow.drained(sub)
        assert a.reading and b.reading

    asyncio.run(scenario())


def test_a_subscriber_that_does_not_drain_in_time_holds_publishers_no_longer() -> None:
    async def scenario() -> None:
        a, b, stuck = Link("a"), Link("b"), Link("stuck")
        flow, metrics = flow_of(a, b, stuck)
        flow.when_full(stuck, "a", FULL)
        await asyncio.sleep(0.02)
        flow.when_full(stuck, "b", FULL)  # b waits too, from later on
        await asyncio.sleep(0.06)  # a's wait is over
        assert a.reading and b.reading, "both read on once the subscriber is stuck"
        assert metrics.get("qos0_subscribers_stuck") == 1
        assert flow.when_full(stuck, "a", FULL) == SEND  # still sent, under write_buffer_high
        assert a.reading, "nobody waits for a stuck subscriber"
        assert flow.waiting == 0
        await asyncio.sleep(0.1)  # b's own wait ended with a's: no second release
        assert b.calls == ["hold", "release"]
        flow.drained(stuck)  # it read again: publishers wait for it again
        flow.when_full(stuck, "a", FULL)
        assert not a.reading

    asyncio.run(scenario())


def test_no_publisher_waits_for_itself_for_a_peer_or_with_waiting_off() -> None:
    async def scenario() -> None:
        both, sub = Link("both"), Link("sub")
        flow, _ = flow_of(both, sub)
        assert flow.when_full(both, "both", FULL) == SEND  # its own subscription
        assert flow.when_full(sub, "on-a-peer", FULL) == SEND  # not connected here
        assert both.reading and flow.waiting == 0
        off, _ = flow_of(both, sub, qos0_publisher_wait=0.0)
        assert off.when_full(sub, "both", FULL) == SEND
        assert both.reading

    asyncio.run(scenario())


def test_past_write_buffer_high_qos0_drops_and_the_subscriber_is_cut_after_the_timeout() -> None:
    async def scenario() -> None:
        pub, sub = Link("pub"), Link("sub")
        flow, metrics = flow_of(pub, sub, slow_consumer_timeout=0.05)
        assert flow.when_full(sub, "pub", 1_000_001) == DROP
        assert flow.when_full(sub, "pub", 1_000_001) == DROP
        assert metrics.get("dropped_slow_consumer") == 2
        assert pub.reading, "a dropped message makes nobody wait"
        assert not sub.closed
        await asyncio.sleep(0.06)
        flow.when_full(sub, "pub", 1_000_001)
        assert sub.closed and "slow consumer" in sub.calls[-1]

    asyncio.run(scenario())


def test_a_drained_subscriber_starts_its_slow_consumer_clock_again() -> None:
    async def scenario() -> None:
        sub = Link("sub")
        flow, _ = flow_of(sub, slow_consumer_timeout=0.05)
        flow.when_full(sub, "x", 1_000_001)
        await asyncio.sleep(0.06)
        flow.drained(sub)
        flow.when_full(sub, "x", 1_000_001)  # a new episode: not cut yet
        assert not sub.closed

    asyncio.run(scenario())


def test_a_departed_publisher_or_subscriber_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        pub, sub, other = Link("pub"), Link("sub"), Link("other")
        flow, metrics = flow_of(pub, sub, other)
        flow.when_full(sub, "pub", FULL)
        flow.when_full(other, "pub", FULL)
        flow.gone(pub)  # the publisher left while it waited
        assert flow.waiting == 0
        await asyncio.sleep(0.08)  # its wait's end was cancelled: nobody is called stuck
        assert metrics.get("qos0_subscribers_stuck") == 0
        flow.when_full(sub, "other", FULL)
        flow.gone(sub)  # the subscriber left: its publisher reads on
        assert other.reading and flow.waiting == 0

    asyncio.run(scenario())
