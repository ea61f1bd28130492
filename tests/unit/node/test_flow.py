"""One connection's flow control (`bridge.node.flow.ConnectionFlow`): when its socket is paused and
read again, how many of its messages may wait for the store, its publish pacing, and the
acknowledgements held for lagging subscribers, on a socket that only records what it was told."""

from __future__ import annotations

import asyncio
import contextlib

from bridge.counters import Metrics
from bridge.mqtt.packets import Pingreq, Publish
from bridge.node.flow import (
    PAUSED_BY_RATE,
    PAUSED_BY_STORE,
    PAUSED_BY_SUBSCRIBER,
    PAUSED_FOR_TURN,
    ConnectionFlow,
)


class Socket:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.resumed_at: list[float] = []  # the loop's clock, when running in a loop

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")
        with contextlib.suppress(RuntimeError):  # called outside a loop: no clock to note
            self.resumed_at.append(asyncio.get_running_loop().time())


def _flow() -> tuple[ConnectionFlow, Socket, Metrics]:
    flow = ConnectionFlow()
    socket = flow.socket = Socket()
    return flow, socket, Metrics()


def test_the_socket_is_paused_once_and_read_again_only_when_every_reason_is_gone() -> None:
    async def main() -> None:
        flow, socket, _ = _flow()
        flow.hold(PAUSED_BY_SUBSCRIBER)
        flow.hold(PAUSED_FOR_TURN)
        flow.hold(PAUSED_BY_SUBSCRIBER)  # the same reason twice is one reason
        assert socket.calls == ["pause"]
        flow.release(PAUSED_BY_RATE)  # never held: changes nothing
        flow.release(PAUSED_BY_SUBSCRIBER)
        assert socket.calls == ["pause"] and flow.pauses == PAUSED_FOR_TURN
        assert flow.release(PAUSED_FOR_TURN) is True  # read again: the keepalive counts anew
        assert socket.calls == ["pause", "resume"] and flow.pauses == 0
        assert flow.release(PAUSED_FOR_TURN) is False  # released twice: no second resume
        assert socket.calls == ["pause", "resume"]

    asyncio.run(main())


def test_reading_stops_at_max_pending_and_resumes_once_half_are_answered() -> None:
    async def main() -> None:
        flow, socket, _ = _flow()
        for _ in range(9):
            flow.publish_taken(10)
        assert socket.calls == []
        flow.publish_taken(10)
        assert socket.calls == ["pause"] and flow.pauses == PAUSED_BY_STORE
        flow.publish_taken(10)  # read before the pause took effect: counted, no second pause
        assert [flow.publish_answered(10) for _ in range(6)] == [False] * 5 + [True]
        assert flow.pending == 5 and socket.calls == ["pause"]
        flow.release(PAUSED_BY_STORE)  # what the connection does when told True
        assert socket.calls == ["pause", "resume"]
        assert not any(flow.publish_answered(10) for _ in range(5))
        assert flow.pending == 0 and socket.calls == ["pause", "resume"]

    asyncio.run(main())


def test_a_store_pause_does_not_end_another_reasons_pause() -> None:
    async def main() -> None:
        flow, socket, _ = _flow()
        flow.hold(PAUSED_BY_SUBSCRIBER)
        flow.publish_taken(2)
        flow.publish_taken(2)
        assert flow.publish_answered(2) is True
        flow.release(PAUSED_BY_STORE)
        assert flow.pauses == PAUSED_BY_SUBSCRIBER and socket.calls == ["pause"]

    asyncio.run(main())


def test_acknowledgements_wait_in_order_until_every_lagging_subscriber_lets_them_go() -> None:
    async def main() -> None:
        flow, _, _ = _flow()
        assert flow.ack_waits(b"a", True) is False  # nothing held: send now
        flow.hold_acks("sub-1")
        flow.hold_acks("sub-2")
        assert flow.ack_waits(b"b", True) is True
        assert flow.ack_waits(b"c", False) is True
        assert flow.release_acks("sub-1") == []  # sub-2 still holds them
        assert flow.release_acks("sub-1") == []
        assert flow.release_acks("sub-2") == [(b"b", True), (b"c", False)]
        assert flow.ack_waits(b"d", True) is False
        assert flow.release_acks("sub-2") == []

    asyncio.run(main())


def test_a_client_over_its_publish_rate_is_read_again_once_out_of_debt() -> None:
    async def main() -> None:
        flow, socket, metrics = _flow()
        flow.charge([Publish("t", b"x", qos=0)] * 500, 10)  # no limits: nothing counted
        assert not flow.paced and socket.calls == []
        flow.limit_publishes(100, 0, asyncio.get_running_loop(), metrics, flow.release)
        assert flow.paced
        flow.charge([Pingreq()] * 150, 10)  # only PUBLISH packets are messages
        assert socket.calls == []
        charged_at = asyncio.get_running_loop().time()
        flow.charge([Publish("t", b"x", qos=0)] * 105, 10)  # 5 over a 100/s bucket: 50 ms
        assert socket.calls == ["pause"] and flow.pauses == PAUSED_BY_RATE
        flow.charge([Publish("t", b"x", qos=0)], 10)  # already paused: one pause, one count
        assert metrics.get("publish_rate_pauses") == 1
        for _ in range(100):
            await asyncio.sleep(0.01)
            if socket.calls == ["pause", "resume"]:
                break
        assert socket.calls == ["pause", "resume"] and flow.pauses == 0
        # 6 messages over at 100/s: read again no sooner than 60 ms after (on the loop's clock,
        # so a busy machine can make it later, never sooner)
        assert socket.resumed_at[0] - charged_at >= 0.06 - 1e-6

    asyncio.run(main())


def test_new_limits_end_a_rate_pause_at_once_and_a_closed_connection_is_never_resumed() -> None:
    async def main() -> None:
        flow, socket, metrics = _flow()
        flow.limit_publishes(1, 0, asyncio.get_running_loop(), metrics, flow.release)
        flow.charge([Publish("t", b"x", qos=0)] * 11, 10)  # 10 s in debt
        assert socket.calls == ["pause"]
        flow.limit_publishes(0, 0, asyncio.get_running_loop(), metrics, flow.release)
        flow.release(PAUSED_BY_RATE)  # limits lifted: the connection reads on at once
        assert socket.calls == ["pause", "resume"] and not flow.paced
        flow.limit_publishes(1, 0, asyncio.get_running_loop(), metrics, flow.release)
        flow.charge([Publish("t", b"x", qos=0)] * 2, 10)  # 1 s in debt
        flow.closed()
        flow.release(PAUSED_BY_RATE)
        assert socket.calls == ["pause", "resume", "pause"]
        assert flow.pauses == 0  # the reasons are still kept up to date

    asyncio.run(main())
