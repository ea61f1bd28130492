"""A publisher faster than its subscriber is slowed down, never trimmed: every message that got a
PUBACK reaches the online subscriber, on the embedded store and through RocketMQ.

The subscriber stops acknowledging for a while (as a device that stalls does), so its backlog
passes `max_queued_messages`; a QoS 1 publisher floods at full speed with 20 messages in flight
(mosquitto_pub's default window). Then the subscriber reads everything. Counted by payload.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from bridge.mqtt.packets import Puback, Publish
from tests.support.clients import RawClient
from tests.support.load import Qos1Publisher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LIMIT = 50
STALL_SECONDS = 2.0
FLOOD_SECONDS = 4.0


def flood_past_a_stalled_subscriber(node, client_id: str) -> tuple[set[str], set[str], int]:
    """(acknowledged to the publisher, delivered to the subscriber, publisher's resends)."""
    publisher_id = f"flood-{uuid.uuid4().hex[:8]}"
    sub = RawClient(node.port)
    sub.connect(client_id, clean_session=False)
    sub.subscribe(f"load/{publisher_id}", 1)
    stop = threading.Event()
    publisher = Qos1Publisher(node.port, publisher_id, stop, window=20, reply_timeout=30.0)
    publisher.start()
    delivered: set[str] = set()
    unacked: list[int] = []
    stalled_until = time.monotonic() + STALL_SECONDS
    flood_until = time.monotonic() + FLOOD_SECONDS
    while time.monotonic() < flood_until or publisher.is_alive():
        if time.monotonic() >= flood_until:
            stop.set()
        if unacked and time.monotonic() >= stalled_until:
            for packet_id in unacked:  # the stall ends: acknowledge what it held
                sub.send(Puback(packet_id))
            unacked.clear()
        try:
            packet = sub.recv(0.2)
        except TimeoutError:
            if stop.is_set() and not publisher.is_alive():
                break
            continue
        assert isinstance(packet, Publish), packet
        delivered.add(packet.payload.decode())
        if time.monotonic() < stalled_until:
            unacked.append(packet.packet_id or 0)  # no PUBACK: the window fills, the backlog grows
            continue
        sub.send(Puback(packet.packet_id or 0))
    publisher.join(30)
    assert publisher.error is None, publisher.error
    # Drain what is left, acknowledging everything (resends after the stall included).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            packet = sub.recv(1.5)
        except TimeoutError:
            break
        assert isinstance(packet, Publish), packet
        delivered.add(packet.payload.decode())
        sub.send(Puback(packet.packet_id or 0))
    return publisher.acked, delivered, publisher.resent


def assert_slowed_not_trimmed(node, acked: set[str], delivered: set[str]) -> None:
    assert len(acked) > 3 * LIMIT, f"the flood must pass the limit ({len(acked)} acknowledged)"
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged messages never delivered"
    log = node.log_text()
    assert "holding the acknowledgements of its publishers" in log
    assert "dropped the" not in log, "an online subscriber's queue was trimmed"


def test_a_flood_past_a_stalled_subscriber_slows_the_publisher_and_loses_nothing(bridge_factory):
    node = bridge_factory(f"max_queued_messages={LIMIT}")
    acked, delivered, _resent = flood_past_a_stalled_subscriber(node, "stalled")
    assert_slowed_not_trimmed(node, acked, delivered)
    wait_until(
        lambda: "stalled caught up" in node.log_text(), 5, "the publisher released once caught up"
    )


@pytest.mark.rocketmq
def test_a_flood_through_rocketmq_past_a_stalled_subscriber_loses_nothing(bridge_factory, rocketmq):
    node = bridge_factory(
        "store=rocketmq",
        f"rocketmq_namesrv={rocketmq.namesrv_addr}",
        f"rocketmq_namespace=bp{uuid.uuid4().hex[:8]}",
        f"max_queued_messages={LIMIT}",
    )
    acked, delivered, _resent = flood_past_a_stalled_subscriber(node, "stalled-rmq")
    assert_slowed_not_trimmed(node, acked, delivered)


def test_a_subscriber_that_disconnects_while_behind_releases_its_publishers(bridge_factory):
    node = bridge_factory(f"max_queued_messages={LIMIT}")
    sub = RawClient(node.port)
    sub.connect("leaves", clean_session=False)
    sub.subscribe("load/steady", 1)
    stop = threading.Event()
    publisher = Qos1Publisher(node.port, "steady", stop, window=20, reply_timeout=30.0)
    publisher.start()
    node.wait_for_log("holding the acknowledgements", timeout=10)
    held = len(publisher.acks)
    sub.close()  # gone without reading: its backlog is an offline session's now
    node.wait_for_log("leaves disconnected", timeout=10)
    wait_until(lambda: len(publisher.acks) > held + 20, 10, "PUBACKs flowing again")
    stop.set()
    publisher.join(30)
    assert publisher.error is None, publisher.error
