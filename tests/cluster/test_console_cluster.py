"""The console's cluster-wide answers on a two-node cluster (real Redis, real RocketMQ): asked on
node A, /stats sums both members' figures and /search/clients and /search/subscriptions find a
client held by node B (A asks B's admin API; B answers only for itself)."""

from __future__ import annotations

import pytest

from tests.support.admin_http import node_call_headers, start_cluster_admin_node
from tests.support.clients import RawClient
from tests.support.cluster import ClusterLauncher

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def test_stats_and_searches_asked_on_one_node_cover_every_member(
    cluster: ClusterLauncher,
) -> None:
    a, api_a = start_cluster_admin_node(cluster, "a")
    b, api_b = start_cluster_admin_node(cluster, "b")
    cluster.wait_linked()
    on_a = RawClient(a.port)
    on_a.connect("dev-a")
    assert on_a.subscribe("plant/+/alarm", 1) == [1]
    for client_id in ("dev-b1", "dev-b2"):
        on_b = RawClient(b.port)
        on_b.connect(client_id)
        assert on_b.subscribe("plant/+/alarm", 1) == [1]

    stats = api_a.wait_for(
        "/stats", lambda d: len(d["nodes"]) == 2 and d["totals"]["connections"] == 3
    )
    assert stats["clustered"] is True and stats["complete"] is True
    per_node = {n["id"]: n["stats"]["sessions"] for n in stats["nodes"]}
    assert per_node == {"a": 1, "b": 2}
    assert stats["totals"]["subscriptions"] == 3
    assert {n["id"]: n["self"] for n in stats["nodes"]} == {"a": True, "b": False}
    # B answers a call signed by node A for itself only (no second fan-out), without a token.
    signed = node_call_headers("GET", "/stats", "a", "b")
    forwarded = api_b.request("GET", "/stats", token=None, headers=signed)[1]
    assert forwarded == {"stats": {**forwarded["stats"], "sessions": 2}}
    # An operator's request that merely claims to come from a node is not one.
    status, refused = api_b.request("GET", "/stats", headers={"X-Bridge-Forwarded-By": "a"})[:2]
    assert status == 401 and refused["error"].startswith("node call refused: node call without")

    found = api_a.get("/search/clients?q=dev-")[1]
    assert [(i["client_id"], i["node"]) for i in found["items"]] == [
        ("dev-a", "a"),
        ("dev-b1", "b"),
        ("dev-b2", "b"),
    ]
    assert found["errors"] == []
    subscribers = api_a.get("/search/subscriptions?topic=plant/7/alarm")[1]
    assert [(i["client_id"], i["node"]) for i in subscribers["items"]] == [
        ("dev-a", "a"),
        ("dev-b1", "b"),
        ("dev-b2", "b"),
    ]
