"""Each client library (MQTT.js over TCP and over WebSocket) in a 3-node cluster behind HAProxy:
kill -9 of the node a persistent subscriber is on, the library's own reconnect brings it back
through the balancer to another node, which resumes its session; every message a publisher had
acknowledged is delivered."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable

from tests.interop.conftest import BalancedCluster, Client
from tests.interop.driver import Driver

Drivers = Callable[[str], Driver]


def publish_numbered(pub: Driver, topic: str, numbers: range, acked: list[str]) -> None:
    """QoS 1 publishes of `numbers`; those the server acknowledged go into `acked`. A publish
    that fails or times out (its node died under it) is not acknowledged, so not owed."""
    for n in numbers:
        payload = f"m{n}"
        if pub.publish(f"{topic}/data", payload, 1, check=False, timeout=5)["ok"]:
            acked.append(payload)


def wait_for_route(pub: Driver, sub: Driver, topic: str, timeout: float = 20.0) -> None:
    """Publish probes until one reaches the subscriber: its subscription has reached every
    node (the publisher may be on another one). Probes that still come are dropped later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pub.publish(f"{topic}/probe", "probe", 0)
        if sub.quiet(0.2):
            return
    raise AssertionError(f"no probe reached the subscriber in {timeout} s")


def test_client_reconnects_itself_after_its_node_is_killed_and_gets_every_acknowledged_message(
    client: Client, balanced_cluster: BalancedCluster, drivers: Drivers
) -> None:
    cluster = balanced_cluster
    topic = f"interop/{client.library}/kill/{uuid.uuid4().hex[:8]}"
    sub_id = f"interop-sub-{uuid.uuid4().hex[:8]}"
    sub, pub = drivers("sub"), drivers("pub")
    sub.connect(cluster.url(client), sub_id, version=4, clean=False, reconnect=True, keepalive=5)
    sub.subscribe(f"{topic}/data", qos=1)
    sub.subscribe(f"{topic}/probe", qos=0)
    victim = cluster.node_of(sub_id)
    # The publisher is on a node that survives: what is proved is the subscriber's reconnect.
    survivor = next(n for n in cluster.ports if n != victim)
    pub.connect(cluster.node_url(survivor, client), f"interop-pub-{sub_id}", version=4)
    wait_for_route(pub, sub, topic)
    acked: list[str] = []
    publish_numbered(pub, topic, range(0, 30), acked)

    os.kill(cluster.launcher.nodes[victim].pid, signal.SIGKILL)
    try:
        sub.wait_event("connection_lost", timeout=15)
        publish_numbered(pub, topic, range(30, 60), acked)
        sub.wait_event("reconnected", timeout=30)
        publish_numbered(pub, topic, range(60, 90), acked)
        received: set[str] = set()
        deadline = time.monotonic() + 30
        while not received.issuperset(acked) and time.monotonic() < deadline:
            received.update(m["payload"] for m in sub.quiet(0.2) if m["topic"] == f"{topic}/data")
    finally:
        cluster.launcher.nodes[victim].proc.wait(10)
        cluster.start(victim)

    assert len(acked) == 90
    missing = [p for p in acked if p not in received]
    assert not missing, f"{len(missing)} acknowledged messages never delivered: {missing[:10]}"
