"""A persistent session that resumes on another node gets what it is owed at once.

The nodes re-read their readers' queue ends only every `interest_grace` seconds after a move
(30 s here, against 1 s in the other cluster tests), so a message that arrives within the
tests' bound (10 s) was delivered because the resume itself looked, not a periodic check. Each
test prints the time from CONNACK to the first message."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt.packets import Publish, Subscription
from bridge.mqtt.properties import PropertyId
from tests.support.cluster import ClusterLauncher
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

SLOW_REREAD = "interest_grace=30"
KEEP = {PropertyId.SESSION_EXPIRY_INTERVAL: 3600}


def three_nodes(cluster: ClusterLauncher) -> tuple[BridgeProcess, BridgeProcess, BridgeProcess]:
    nodes = tuple(cluster.start(n, SLOW_REREAD) for n in ("a", "b", "c"))
    cluster.wait_linked()
    return nodes  # type: ignore[return-value]


def subscribe_until_routed(node: BridgeProcess, publisher: RawClient5, topic: str) -> RawClient5:
    """A persistent v5 session on `node` subscribed to `topic`/# at QoS 2; returns once a QoS 0
    probe `publisher` sends (on another node) reaches it."""
    sub = RawClient5(node.port)
    assert sub.connect("resumer", False, properties=KEEP).return_code == 0
    assert sub.subscribe_many(Subscription(f"{topic}/#", 2)) == [2]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        publisher.publish(f"{topic}/probe", b"probe", 0)
        try:
            packet = sub.recv(0.2)
        except Exception:
            continue
        if isinstance(packet, Publish):
            time.sleep(0.3)
            while True:
                try:
                    sub.recv(0.2)
                except Exception:
                    return sub
    raise AssertionError("the subscription never reached the publishing node")


def first_after_resume(node: BridgeProcess) -> tuple[float, list[Publish]]:
    """Resume the session on `node`; seconds from CONNACK to the first PUBLISH, and what came
    within the next moment."""
    client = RawClient5(node.port, timeout=10)
    connack = client.connect("resumer", False, properties=KEEP)
    started = time.monotonic()
    assert connack.return_code == 0 and connack.session_present
    first = client.recv_publish(10)
    took = time.monotonic() - started
    got = [first]
    while True:
        try:
            got.append(client.recv_publish(0.5))
        except Exception:
            break
    client.close()
    return took, [p for p in got if p.payload != b"probe"]


def test_in_flight_messages_come_back_at_once_on_a_node_that_never_held_the_session(
    cluster: ClusterLauncher,
) -> None:
    a, _b, c = three_nodes(cluster)
    sub = RawClient5(a.port)
    assert sub.connect("resumer", False, properties=KEEP).return_code == 0
    assert sub.subscribe_many(Subscription("inflight/#", 2)) == [2]
    sub.send(Publish("inflight/x", b"one", 1, False, packet_id=1))
    sub.send(Publish("inflight/x", b"two", 2, False, packet_id=2))
    got = []
    while len(got) < 2:  # received, not acknowledged
        packet = sub.recv(10)
        if isinstance(packet, Publish):
            got.append(packet.payload)
    assert sorted(got) == [b"one", b"two"]
    sub.close()
    took, got = first_after_resume(c)
    print(f"first redelivery on another node after {took * 1000:.1f} ms")
    assert sorted(p.payload for p in got) == [b"one", b"two"]
    assert all(p.dup for p in got if p.qos)


def test_the_offline_backlog_comes_at_once_on_a_node_that_never_held_the_session(
    cluster: ClusterLauncher,
) -> None:
    a, b, c = three_nodes(cluster)
    publisher = RawClient5(b.port)
    publisher.connect("pub-backlog")
    sub = RawClient5(a.port)
    assert sub.connect("resumer", False, properties=KEEP).return_code == 0
    assert sub.subscribe_many(Subscription("backlog/#", 2)) == [2]
    sub.disconnect()
    for i in range(5):
        publisher.publish("backlog/x", f"m{i}".encode(), 1, packet_id=i + 1)
    took, got = first_after_resume(c)
    print(f"first backlog message on another node after {took * 1000:.1f} ms")
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(5)]
