"""Banned clients through a crash of the cluster's Redis: while Redis is down a node keeps
enforcing the bans it last read (and refuses to change them, 503); the bans survive the crash
(AOF, fsync always); a node that joins afterwards enforces them before it takes clients; and the
node that lived through the outage listens again, so a ban made later kicks its client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import AdminHttp, start_cluster_admin_node
from tests.support.cluster import ClusterLauncher
from tests.support.mqtt5 import connect_5, paho5
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalRedis
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ

pytestmark = [pytest.mark.fault, pytest.mark.rocketmq, pytest.mark.timeout(240)]


def listed(api: AdminHttp) -> list[tuple[str, str]]:
    return [(b["kind"], b["value"]) for b in api.get("/banned")[1]["items"]]


def test_bans_outlive_a_redis_crash_and_hold_on_a_node_that_joins_later(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    tmp_path: Path,
) -> None:
    redis = LocalRedis(tmp_path / "redis", appendfsync="always").start()
    try:
        cluster = ClusterLauncher(
            bridge_factory, rocketmq.namesrv_addr, (f"redis_url={redis.url}",)
        )
        a, api_a = start_cluster_admin_node(cluster, "a")
        assert api_a.post("/banned", {"clientid": "outlaw", "seconds": 3600})[0] == 201
        assert api_a.post("/banned", {"address": "192.0.2.0/24", "seconds": 3600})[0] == 201
        bans = [("address", "192.0.2.0/24"), ("clientid", "outlaw")]

        redis.kill()
        assert connect_5(a.port, "outlaw") == ReasonCode.BANNED  # the last list read holds
        assert listed(api_a) == bans
        status, error = api_a.post("/banned", {"clientid": "other", "seconds": 60})
        assert status == 503 and "ban not stored" in error["error"]

        redis.restart()
        b, api_b = start_cluster_admin_node(cluster, "b")
        assert listed(api_b) == bans
        assert connect_5(b.port, "outlaw") == ReasonCode.BANNED

        # Node A listens for changes again: a ban made through B kicks A's client.
        api_a.wait_for("/ready", lambda d: d["status"] == "ready")
        with paho5(a.port, "late") as victim:
            assert api_b.post("/banned", {"clientid": "late", "seconds": 60})[0] == 201
            reason, _props = victim.wait_disconnect()
            assert reason == ReasonCode.ADMINISTRATIVE_ACTION
        assert connect_5(a.port, "late") == ReasonCode.BANNED
        a.wait_for_log("not listening for ban changes in Redis")
    finally:
        redis.stop()
