"""The admin API of a two-node cluster (real Redis, real RocketMQ, real MQTT clients): /nodes
lists both members with what their heartbeats publish, and a client connected to node B is
inspected and kicked through node A (A forwards to B's admin API)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bridge.mqtt.packets import Will
from tests.support.admin_http import start_cluster_admin_node
from tests.support.clients import RawClient, paho_client
from tests.support.cluster import ClusterLauncher, wait_for_route

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def connections_of(nodes: dict[str, Any], node_id: str) -> int | None:
    return {n["id"]: n["connections"] for n in nodes["nodes"]}.get(node_id)


def test_nodes_lists_both_members_and_counts_connections_cluster_wide(
    cluster: ClusterLauncher,
) -> None:
    a, api_a = start_cluster_admin_node(cluster, "a")
    b, api_b = start_cluster_admin_node(cluster, "b")
    cluster.wait_linked()
    data = api_a.wait_for("/nodes", lambda d: len([n for n in d["nodes"] if n["alive"]]) == 2)
    assert data["clustered"] is True
    nodes = {n["id"]: n for n in data["nodes"]}
    assert nodes["a"]["self"] is True and nodes["b"]["self"] is False
    assert nodes["a"]["admin"] == f"127.0.0.1:{api_a.port}"
    assert nodes["b"]["admin"] == f"127.0.0.1:{api_b.port}"
    assert nodes["b"]["role"] == "bridge" and nodes["b"]["peer"]
    assert 0 < nodes["b"]["started"] <= time.time()
    with paho_client(b.port), paho_client(b.port), paho_client(a.port):
        # B's heartbeat (every second here) carries its count to A.
        counts = api_a.wait_for("/connections/count", lambda d: d["cluster"] == 3)
        assert counts["node"] == 1
        nodes = api_a.wait_for("/nodes", lambda d: connections_of(d, "b") == 2)
        assert connections_of(nodes, "a") in (0, 1)  # as of A's last heartbeat
    ready = {"status": "ready", "node": "b", "redis": "ok"}
    assert api_b.get("/ready", token=None) == (200, ready)


def test_a_client_on_node_b_is_inspected_and_kicked_through_node_a(
    cluster: ClusterLauncher,
) -> None:
    a, api_a = start_cluster_admin_node(cluster, "a")
    b, _api_b = start_cluster_admin_node(cluster, "b")
    cluster.wait_linked()
    client_id = "remote/dev 1"
    with paho_client(a.port) as watcher, paho_client(b.port) as prober:
        watcher.client.subscribe("wills/#", 1)
        wait_for_route(lambda p: prober.client.publish("wills/probe", p), watcher)
        victim = RawClient(b.port)
        victim.connect(client_id, will=Will("wills/remote", b"gone", 1, False))
        assert victim.subscribe("cmd/+", 1) == [1]
        data = api_a.wait_for(
            "/clients/remote%2Fdev%201", lambda d: d.get("subscriptions") == {"cmd/+": 1}
        )
        assert data["node"] == "b" and data["connected"] is True
        assert data["client_id"] == client_id and data["ip"] == "127.0.0.1"
        status, kicked = api_a.delete("/clients/remote%2Fdev%201")
        assert status == 200, kicked
        assert kicked == {"kicked": True, "client_id": client_id, "node": "b"}
        victim.expect_closed()
        will = watcher.get(timeout=15)
        assert (will.topic, will.payload) == ("wills/remote", b"gone")
    # The clean session ended with its connection: no node knows the client now.
    deadline = time.monotonic() + 15
    while api_a.client(client_id)[0] != 404:
        assert time.monotonic() < deadline, api_a.client(client_id)
        time.sleep(0.2)
    assert api_a.delete("/clients/remote%2Fdev%201")[0] == 404
    assert api_a.client("nobody-anywhere") == (404, {"error": "unknown client 'nobody-anywhere'"})
