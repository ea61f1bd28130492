"""A node's lease on its clients (`bridge.cluster.lease`): when a cut-off node stops serving, and
how long a taker whose Release went unanswered waits for the old node."""

from __future__ import annotations

import asyncio

from bridge.cluster.lease import Lease, margin_of, wait_for_holder


def test_a_node_that_has_a_link_to_every_member_keeps_serving_without_redis() -> None:
    lease = Lease(node_timeout=6.0, now=100.0)
    assert not lease.must_fence(now=200.0, cut_off=False)


def test_a_cut_off_node_stops_serving_a_margin_before_its_heartbeat_can_lapse_and_once() -> None:
    lease = Lease(node_timeout=6.0, now=100.0)
    assert margin_of(6.0) == 2.0
    assert not lease.must_fence(now=103.9, cut_off=True)
    assert lease.must_fence(now=104.0, cut_off=True)
    assert lease.fenced and not lease.must_fence(now=105.0, cut_off=True)


def test_a_heartbeat_through_again_ends_the_fence_and_moves_the_lease_on() -> None:
    lease = Lease(node_timeout=6.0, now=100.0)
    assert lease.must_fence(now=105.0, cut_off=True)
    assert lease.renewed(sent=105.5, now=105.6) is True and not lease.fenced
    assert not lease.must_fence(now=109.0, cut_off=True)
    assert lease.renewed(sent=104.0, now=109.0) is False and lease.renewed_from == 105.5


def test_a_heartbeat_sent_before_a_cut_and_answered_after_it_does_not_end_the_fence() -> None:
    lease = Lease(node_timeout=6.0, now=100.0)
    assert lease.must_fence(now=104.5, cut_off=True)
    assert lease.renewed(sent=101.0, now=110.0) is False and lease.fenced


class Leases:
    """Redis as the taker reads it: the holder's heartbeat expiry at each read, then the clock."""

    def __init__(self, expiries: list[int | Exception | None], now: int = 1_000) -> None:
        self.expiries = expiries
        self.now = now
        self.reads = 0

    async def lease_of(self, node_id: str) -> tuple[int | None, int]:
        self.reads += 1
        expiry = self.expiries[min(self.reads, len(self.expiries)) - 1]
        if isinstance(expiry, Exception):
            raise expiry
        return expiry, self.now


def wait(registry: Leases, node_timeout: float = 5.0) -> bool:
    return asyncio.run(wait_for_holder(registry, "n1", "phone", node_timeout, poll=0.01))


def test_the_taker_serves_once_the_holders_heartbeat_has_lapsed() -> None:
    registry = Leases([1_500, 1_500, 900])  # alive, alive, lapsed (Redis's clock: 1,000)
    assert wait(registry) is True and registry.reads == 3


def test_the_taker_serves_once_the_holder_renewed_after_the_claim_and_looked_clients_up() -> None:
    registry = Leases([1_500, 1_500, 3_500])
    assert wait(registry) is True and registry.reads == 3


def test_a_holder_that_never_lapses_nor_renews_is_waited_for_only_so_long() -> None:
    registry = Leases([RuntimeError("Redis away"), 1_500])
    assert wait(registry, node_timeout=0.05) is False
    assert registry.reads > 2


def test_a_node_with_no_heartbeat_at_all_is_not_waited_for() -> None:
    registry = Leases([None])
    assert wait(registry) is True and registry.reads == 1


def test_a_pause_stops_serving_only_if_the_lease_may_have_lapsed_in_it() -> None:
    """A loop held up 2.8 s by a busy machine (heartbeat 4.4 s old, node_timeout 6 s) went on
    serving before the pause check, and must: no taker serves before the lease lapses."""
    lease = Lease(node_timeout=6.0, now=100.0)
    assert not lease.lapsed_meanwhile(now=104.4)
    assert lease.lapsed_meanwhile(now=105.6) and lease.fenced
    assert not lease.lapsed_meanwhile(now=107.0)  # once per fence
