"""Banned clients in a two-node cluster (real Redis, real RocketMQ, real MQTT clients): a ban made
through node A's admin API kicks the client connected to node B at once and refuses it on B; a
ban lifted through B lets it in on A; a flapping ClientId's connects are counted across both
nodes, and the ban that follows holds on both."""

from __future__ import annotations

import pytest

from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import start_cluster_admin_node
from tests.support.cluster import ClusterLauncher
from tests.support.mqtt5 import connect_5, paho5

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def test_a_ban_made_on_one_node_kicks_and_refuses_the_client_on_the_other(
    cluster: ClusterLauncher,
) -> None:
    a, api_a = start_cluster_admin_node(cluster, "a")
    b, api_b = start_cluster_admin_node(cluster, "b")
    cluster.wait_linked()
    with paho5(b.port, "roamer") as victim:
        status, ban = api_a.post("/banned", {"clientid": "roamer", "seconds": 600})
        assert status == 201, ban
        reason, _props = victim.wait_disconnect()
        assert reason == ReasonCode.ADMINISTRATIVE_ACTION
    b.wait_for_log("client roamer (127.0.0.1:")
    assert connect_5(b.port, "roamer") == ReasonCode.BANNED
    assert connect_5(a.port, "roamer") == ReasonCode.BANNED
    listed = api_b.get("/banned")[1]["items"]
    assert [(x["kind"], x["value"]) for x in listed] == [("clientid", "roamer")]

    assert api_b.delete("/banned/clientid/roamer")[0] == 200
    api_a.wait_for("/banned", lambda d: d["items"] == [])
    assert connect_5(a.port, "roamer") == ReasonCode.SUCCESS


def test_a_flapping_clientid_is_counted_across_nodes_and_banned_on_both(
    cluster: ClusterLauncher,
) -> None:
    flapping = ("flapping_max_connects=3", "flapping_window=600", "flapping_ban_seconds=600")
    a, api_a = start_cluster_admin_node(cluster, "a", *flapping)
    b, api_b = start_cluster_admin_node(cluster, "b", *flapping)
    cluster.wait_linked()
    # Three connects, spread as a load balancer would: none of the nodes saw more than two.
    for node in (a, b, a):
        assert connect_5(node.port, "hopper") == ReasonCode.SUCCESS
    assert connect_5(b.port, "hopper") == ReasonCode.BANNED
    ban = api_a.wait_for("/banned", lambda d: len(d["items"]) == 1)["items"][0]
    assert (ban["kind"], ban["value"], ban["by"]) == ("clientid", "hopper", "flapping")
    assert connect_5(a.port, "hopper") == ReasonCode.BANNED
    b.wait_for_log("banned clientid 'hopper' for 600 s (flapping)")
    _status, metrics = api_b.get("/metrics")
    assert "mqtt_bridge_flapping_bans_total 1.0" in metrics
