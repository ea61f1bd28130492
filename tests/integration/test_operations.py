"""What operators and backends observe, on a real bridge with real clients: client events on
`$SYS/.../clients/<id>/connected|disconnected`, `$SYS` statistics, pre-subscriptions, Prometheus
metrics after known traffic, and metering counters in Redis after known traffic."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.mqtt.packets import Connect, Puback, Publish
from tests.support.admin_http import TOKEN
from tests.support.clients import RawClient, paho_client
from tests.support.processes import BridgeProcess, free_port
from tests.support.redis import LocalRedis

pytestmark = pytest.mark.integration


def scrape(admin_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the node's /metrics: (name, sorted labels) -> value."""
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/api/v1/metrics")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def api(admin_port: int, path: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{admin_port}/api/v1{path}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_client_events_tell_subscribers_who_connected_and_why_they_left(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("node_id=n1")
    with paho_client(node.port, "presence-watcher") as watcher:
        watcher.client.subscribe("$SYS/brokers/+/clients/+/+", qos=1)
        time.sleep(0.3)
        with paho_client(node.port, "plant/dev+1") as device:
            device.client.username_pw_set("alice")  # not sent: already connected
        events = watcher.drain(2, timeout=10)
        abrupt = RawClient(node.port)
        abrupt.send(Connect("dev-2", username="bob", password=b"x"))
        abrupt.recv()
        abrupt.close()  # no DISCONNECT
        events += watcher.drain(2, timeout=10)
    by_topic = {m.topic: json.loads(m.payload) for m in events}
    assert set(by_topic) == {
        "$SYS/brokers/n1/clients/plant%2Fdev%2B1/connected",
        "$SYS/brokers/n1/clients/plant%2Fdev%2B1/disconnected",
        "$SYS/brokers/n1/clients/dev-2/connected",
        "$SYS/brokers/n1/clients/dev-2/disconnected",
    }
    connected = by_topic["$SYS/brokers/n1/clients/dev-2/connected"]
    assert connected["clientid"] == "dev-2" and connected["username"] == "bob"
    assert connected["ip"] == "127.0.0.1" and connected["node"] == "n1"
    assert connected["listener"] == "tcp" and connected["clean_session"] is True
    assert by_topic["$SYS/brokers/n1/clients/plant%2Fdev%2B1/disconnected"]["reason"] == (
        "disconnect"
    )
    gone = by_topic["$SYS/brokers/n1/clients/dev-2/disconnected"]
    assert gone["reason"] == "connection closed by client"
    assert gone["ts"] >= gone["connected_at"] > 0
    assert all(m.qos == 1 for m in events)


def test_sys_statistics_are_retained_and_count_the_traffic(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("node_id=n1", "sys_interval=0.2")
    with paho_client(node.port) as pub:
        for index in range(3):
            pub.client.publish("stats/t", f"m{index}", qos=1).wait_for_publish(10)
        time.sleep(0.6)  # a statistics interval passes
        with paho_client(node.port) as late:
            late.client.subscribe("$SYS/brokers/n1/#", qos=0)
            stats = {m.topic: m.payload.decode() for m in late.drain(12, timeout=10)}
    assert stats["$SYS/brokers/n1/messages/received"] == "3"
    assert stats["$SYS/brokers/n1/clients/connected"] in ("1", "2")
    assert stats["$SYS/brokers/n1/version"].startswith("mqtt-bridge ")
    assert int(stats["$SYS/brokers/n1/uptime"]) >= 0
    assert set(stats) == {
        f"$SYS/brokers/n1/{name}"
        for name in __import__("bridge.operations.systopics", fromlist=["STATISTICS"]).STATISTICS
    }


def test_every_client_gets_its_presubscriptions_without_subscribing(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("presubscribe=1:devices/%c/cmd,0:broadcast/%u")
    device = RawClient(node.port)
    device.send(Connect("d1", clean_session=False, username="line3"))
    assert device.recv().return_code == 0
    with paho_client(node.port) as backend:
        backend.client.publish("devices/d1/cmd", "start", qos=1).wait_for_publish(10)
        backend.client.publish("broadcast/line3", "shift", qos=0).wait_for_publish(10)
        backend.client.publish("devices/d2/cmd", "not-for-d1", qos=1).wait_for_publish(10)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            packet = device.recv()
            if isinstance(packet, Publish):
                got.append((packet.topic, packet.payload, packet.qos))
                if packet.qos == 1:
                    device.send(Puback(packet.packet_id))
        assert sorted(got) == [("broadcast/line3", b"shift", 0), ("devices/d1/cmd", b"start", 1)]
        device.close()
        # The persistent session keeps the pre-subscription while the device is offline.
        backend.client.publish("devices/d1/cmd", "while-away", qos=1).wait_for_publish(10)
    back = RawClient(node.port)
    back.send(Connect("d1", clean_session=False, username="line3"))
    assert back.recv().session_present is True
    packet = back.recv()
    assert isinstance(packet, Publish) and packet.payload == b"while-away"


def test_metrics_count_known_traffic_exactly(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    acl = tmp_path / "acl.conf"
    acl.write_text("deny all publish forbidden/#\nallow all all #\n")
    admin_port = free_port()
    node = bridge_factory(
        f"admin_listen=127.0.0.1:{admin_port}", f"admin_token={TOKEN}", f"acl_file={acl}"
    )
    with paho_client(node.port, "sub") as sub, paho_client(node.port, "pub") as pub:
        sub.client.subscribe("data/#", qos=2)
        time.sleep(0.3)
        for qos, count in ((0, 5), (1, 4), (2, 3)):
            for index in range(count):
                pub.client.publish(f"data/q{qos}", f"{qos}-{index}", qos=qos).wait_for_publish(10)
        pub.client.publish("forbidden/x", "no", qos=1).wait_for_publish(10)
        assert len(sub.drain(12, timeout=15)) == 12
        time.sleep(0.3)  # the subscriber's last acknowledgements arrive
        metrics = scrape(admin_port)

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    assert value("mqtt_bridge_connections") == 2
    for qos, count in (("0", 5), ("1", 4), ("2", 3)):
        assert value("mqtt_bridge_messages_received_total", qos=qos) == count
        assert value("mqtt_bridge_messages_sent_total", qos=qos) == count
    assert value("mqtt_bridge_packets_received_total", type="publish") == 13
    assert value("mqtt_bridge_packets_received_total", type="subscribe") == 1
    assert value("mqtt_bridge_packets_received_total", type="connect") == 2
    assert value("mqtt_bridge_packets_sent_total", type="connack") == 2
    assert value("mqtt_bridge_packets_sent_total", type="publish") == 12
    assert value("mqtt_bridge_packets_sent_total", type="puback") == 5  # 4 + the denied one
    assert value("mqtt_bridge_packets_received_total", type="pubrel") == 3
    assert value("mqtt_bridge_messages_dropped_total", reason="acl_denied") == 1
    assert value("mqtt_bridge_acl_denied_total", action="publish") == 1
    assert value("mqtt_bridge_store_latency_seconds_count") == 7  # QoS 1 and 2, not the denied
    assert value("mqtt_bridge_inflight") == 0
    assert value("mqtt_bridge_bytes_received_total") > 0
    assert value("mqtt_bridge_bytes_sent_total") > 0


def test_metering_counts_per_client_and_user_arrive_in_redis_exactly_without_refused_publishes(
    bridge_factory: Callable[..., BridgeProcess], redis_server: LocalRedis
) -> None:
    cluster = f"m{uuid.uuid4().hex[:8]}"
    admin_port = free_port()
    node = bridge_factory(
        f"metering_redis_url={redis_server.url}",
        f"cluster_name={cluster}",
        "metering_interval=0.3",
        f"admin_listen=127.0.0.1:{admin_port}",
        f"admin_token={TOKEN}",
    )
    payloads = [b"x" * size for size in (1, 10, 100, 1000)]
    with paho_client(node.port, "meter-sub") as sub:
        sub.client.subscribe("meter/#", qos=1)
        time.sleep(0.3)
        publisher = RawClient(node.port)
        publisher.send(Connect("meter-pub", username="acme", password=b"-"))
        assert publisher.recv().return_code == 0
        # Refused ($SYS is the broker's), and PUBACKed all the same (3.1.1 cannot say no).
        publisher.publish("$SYS/meter", b"refused, not metered", qos=1, packet_id=99)
        for index, payload in enumerate(payloads):
            publisher.publish("meter/t", payload, qos=index % 2, packet_id=index + 1)
        assert len(sub.drain(4, timeout=10)) == 4
        publisher.disconnect()
        time.sleep(1.0)  # two flush intervals
    client = redis_server.client()
    try:
        pub_counts = client.hgetall(f"{cluster}:meter:client:meter-pub")
        user_counts = client.hgetall(f"{cluster}:meter:user:acme")
        sub_counts = client.hgetall(f"{cluster}:meter:client:meter-sub")
    finally:
        client.close()
    total = sum(len(p) for p in payloads)
    assert pub_counts == {"msgs_in": "4", "bytes_in": str(total)}
    assert user_counts == pub_counts
    assert sub_counts == {"msgs_out": "4", "bytes_out": str(total)}
    # The admin API reads the same counters back (for billing).
    user = api(admin_port, "/metering/users/acme")
    assert user["source"] == "redis"
    assert (user["msgs_in"], user["bytes_in"], user["msgs_out"]) == (4, total, 0)
    sub = api(admin_port, "/metering/clients/meter-sub")
    assert (sub["msgs_out"], sub["bytes_out"]) == (4, total)
    with pytest.raises(urllib.error.HTTPError) as unknown:
        api(admin_port, "/metering/clients/never-seen")
    assert unknown.value.code == 404
    assert "nothing metered" in json.loads(unknown.value.read())["error"]


def test_metering_without_redis_is_kept_by_the_node_and_read_from_the_api(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    admin_port = free_port()
    node = bridge_factory(f"admin_listen=127.0.0.1:{admin_port}", f"admin_token={TOKEN}")
    with paho_client(node.port, "solo") as pub:
        for _ in range(3):
            pub.client.publish("a/b", b"12345", qos=1).wait_for_publish(10)
        counts = api(admin_port, "/metering/clients/solo")
    assert counts["source"] == "node"
    assert (counts["msgs_in"], counts["bytes_in"]) == (3, 15)
