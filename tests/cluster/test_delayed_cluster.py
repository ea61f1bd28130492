"""Delayed publish in a cluster over the real RocketMQ: the broker's timer holds the message, and
at its due time notify (one reader per queue in the cluster) routes it once, to subscribers on
every node."""

from __future__ import annotations

import time

import pytest

from tests.support.clients import paho_client
from tests.support.cluster import ClusterLauncher, wait_for_route

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

EARLY_MARGIN = 0.15
LATE_BOUND = 8.0
"""The broker's timer has 1 s steps; notify's rebalance and a busy shared machine add more."""


@pytest.mark.parametrize("qos", [1, 2])
def test_a_delayed_publish_reaches_subscribers_on_both_nodes_once_at_its_due_time(
    cluster: ClusterLauncher, qos: int
) -> None:
    a = cluster.start("a")
    b = cluster.start("b")
    cluster.wait_linked()
    topic = f"later{cluster.name}"
    with (
        paho_client(a.port) as on_a,
        paho_client(b.port) as on_b,
        paho_client(a.port) as on_a_hash,
        paho_client(b.port) as publisher,
    ):
        on_a.client.subscribe(f"{topic}/+", qos)
        on_b.client.subscribe(f"{topic}/+", qos)
        on_a_hash.client.subscribe([("$delayed/#", 1)])
        for reader in (on_a, on_b):
            wait_for_route(lambda p: publisher.client.publish(f"{topic}/probe", p), reader)
        time.sleep(0.3)
        for reader in (on_a, on_b):
            while reader.drain(1, timeout=0.05):
                pass  # probes for the other reader
        sent = time.monotonic()
        publisher.client.publish(f"$delayed/2/{topic}/door", b"open", qos=qos).wait_for_publish(10)
        assert time.monotonic() - sent < 2 - EARLY_MARGIN, "acknowledged when stored, not due"
        got_a = on_a.get(2 + LATE_BOUND)
        arrived = time.monotonic() - sent
        got_b = on_b.get(LATE_BOUND)
        assert arrived >= 2 - EARLY_MARGIN, f"delivered {arrived:.2f} s after publishing"
        for message in (got_a, got_b):
            assert (message.topic, message.payload, message.qos) == (f"{topic}/door", b"open", qos)
        time.sleep(1.5)  # nothing more: once per subscriber, not once per node
        assert on_a.drain(1, timeout=0.1) == [] and on_b.drain(1, timeout=0.1) == []
        assert on_a_hash.drain(1, timeout=0.1) == []
    notify_logs = a.log_text() + b.log_text()
    assert "Traceback" not in notify_logs
