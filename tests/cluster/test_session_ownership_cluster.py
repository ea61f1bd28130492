"""Sessions bound to their identity across the nodes of a cluster (real Redis and RocketMQ): a
session made on one node, or a live connection there, is refused to another user with its
ClientId on another node (the registry's claim checks the identity), and the owner still gets
her queued message wherever she reconnects. A session that ended while Redis was unreachable
frees its ClientId once Redis is back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bridge.mqtt.packets import Pingreq, Pingresp, Publish
from tests.support.cluster import ClusterLauncher
from tests.support.identities import (
    access_settings,
    assert_closed_with_nothing_delivered,
    connect_311,
    publish_to_alice,
)
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalRedis
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

SECRET = "cluster_secret=" + "s" * 32


@pytest.fixture
def two_nodes(tmp_path: Path, cluster: ClusterLauncher) -> tuple[BridgeProcess, BridgeProcess]:
    """Nodes a and b with alice's and mallory's password file and ACL, anonymous refused."""
    settings = (*access_settings(tmp_path), "allow_anonymous=false", SECRET)
    a = cluster.start("a", *settings)
    b = cluster.start("b", *settings)
    cluster.wait_linked()
    return a, b


def test_a_session_made_on_one_node_is_refused_to_another_user_on_another_node(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    alice, connack = connect_311(a.port, "alice-phone", "alice", clean=False)
    assert connack.return_code == 0
    assert alice.subscribe("alice/#", 1) == [1]
    alice.disconnect()
    publish_to_alice(a.port, b"salary")

    for clean in (False, True):
        mallory, connack = connect_311(b.port, "alice-phone", "mallory", clean=clean)
        assert (connack.return_code, connack.session_present) == (5, False)
        assert_closed_with_nothing_delivered(mallory)
    b.wait_for_log("its session belongs to user 'alice', not to user 'mallory'")

    alice, connack = connect_311(b.port, "alice-phone", "alice", clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    message = alice.recv(timeout=15)
    assert isinstance(message, Publish), message
    assert (message.topic, message.payload) == ("alice/bank", b"salary")
    alice.disconnect()


def test_a_live_connection_on_one_node_is_not_kicked_by_another_user_on_another_node(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    alice, connack = connect_311(a.port, "alice-laptop", "alice")
    assert connack.return_code == 0
    mallory, connack = connect_311(b.port, "alice-laptop", "mallory")
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(mallory)
    alice.send(Pingreq())
    assert isinstance(alice.recv(), Pingresp)
    assert alice.subscribe("alice/#", 1) == [1]
    alice.disconnect()
    assert "taken over" not in a.log_text()


def test_a_client_id_whose_session_ended_during_a_redis_outage_is_freed_once_redis_is_back(
    tmp_path: Path, cluster: ClusterLauncher, redis_server: LocalRedis
) -> None:
    proxy = TcpProxy(redis_server.port).start()
    try:
        a = cluster.start(
            "a",
            *access_settings(tmp_path),
            "allow_anonymous=false",
            SECRET,
            f"redis_url=redis://127.0.0.1:{proxy.port}/0",
        )
        alice, connack = connect_311(a.port, "kiosk-4", "alice")
        assert connack.return_code == 0
        proxy.cut()
        alice.disconnect()
        a.wait_for_log("client kiosk-4: registry entry not deleted yet", timeout=15)
        proxy.heal()
        deadline = time.monotonic() + 30
        while True:  # the entry goes at the node's next try (1 s, then 2 s, ... apart)
            mallory, connack = connect_311(a.port, "kiosk-4", "mallory")
            mallory.close()
            if connack.return_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert connack.return_code == 0
    finally:
        proxy.stop()
