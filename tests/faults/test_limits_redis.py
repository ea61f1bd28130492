"""Limits set through the admin API in a cluster survive a crash and restart of Redis, apply on a
node that joins after it, and changes keep reaching every node once Redis is back (each node's
listener subscribes again and re-reads the limits). Real Redis (its own, killed with -9), real
RocketMQ, real bridge processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest

from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.reasons import ReasonCode as R
from tests.support.admin_http import AdminHttp, start_cluster_admin_node
from tests.support.clients import RawClient
from tests.support.cluster import ClusterLauncher
from tests.support.mqtt5 import paho5
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalRedis
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ

pytestmark = [pytest.mark.fault, pytest.mark.rocketmq, pytest.mark.timeout(300)]


def put_limits(api: AdminHttp, changes: dict[str, Any]) -> dict[str, Any]:
    status, data, _ = api.request(
        "PUT", "/limits", json.dumps(changes).encode(), headers={"Content-Type": "application/json"}
    )
    assert status == 200, data
    return dict(data)


def test_limits_survive_a_redis_restart_and_apply_on_a_node_that_joins_later(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    tmp_path: Path,
) -> None:
    redis = LocalRedis(tmp_path / "redis").start()
    try:
        cluster = ClusterLauncher(
            bridge_factory, rocketmq.namesrv_addr, (f"redis_url={redis.url}",)
        )
        a, api_a = start_cluster_admin_node(cluster, "a")
        state = put_limits(api_a, {"client_publish_rate": 10, "max_connections": 2})
        assert state["scope"] == "cluster" and state["limits"]["max_connections"] == 2
        time.sleep(1.5)  # Redis writes its AOF to disk every second (appendfsync everysec)
        redis.kill()
        time.sleep(1.0)
        redis.restart()

        # A node that starts now reads the limits from the restarted Redis.
        b, api_b = start_cluster_admin_node(cluster, "b")
        state = api_b.wait_for("/limits", lambda s: s["overrides"] != {})
        assert state["overrides"] == {"client_publish_rate": 10, "max_connections": 2}
        assert state["defaults"]["max_connections"] == 0
        assert api_a.get("/limits")[1]["limits"] == state["limits"]

        # ...and enforces them: two connections, then CONNACK 0x97 (v5) and 3 (3.1.1).
        with paho5(b.port) as sub, paho5(b.port) as pub:
            with paho5(b.port, expect_refusal=True) as third:
                assert third.connack_reason == R.QUOTA_EXCEEDED
            old = RawClient(b.port)
            old.send(Connect("fourth"))
            connack = old.recv()
            assert isinstance(connack, Connack) and connack.return_code == 3
            old.expect_closed()
            # A publisher over 10 messages/s is read slower, and nothing is lost.
            sub.subscribe(("limits/#", paho.SubscribeOptions(qos=1)))
            started = time.monotonic()
            for i in range(60):
                assert pub.client.publish("limits/x", str(i), 1).rc == paho.MQTT_ERR_SUCCESS
            received = sub.drain(60, timeout=60)
            took = time.monotonic() - started
            assert len(received) == 60, f"only {len(received)} of 60 delivered"
            assert pub.disconnects.empty() and sub.disconnects.empty()
        # 60 at 10/s with 10 saved up and paho's window of 20 ahead: >= 3 s.
        assert took >= 1.5, f"60 messages at 10/s took only {took:.2f} s: not limited"

        # A change after the restart reaches the node that was running through it, at once.
        put_limits(api_b, {"max_connections": None, "client_publish_rate": 50})
        state = api_a.wait_for("/limits", lambda s: s["limits"]["client_publish_rate"] == 50)
        assert state["limits"]["max_connections"] == 0
        a.wait_for_log("limits changed in Redis: max_connections=0, client_publish_rate=50")
    finally:
        redis.stop()
