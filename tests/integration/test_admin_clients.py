"""The admin HTTP API against a real bridge process: nodes, connection counts and clients.
/nodes and /connections/count of a single node, looking clients up (connection details,
subscriptions, user name, protocol; an offline persistent session's queue, then its in-flight
messages), paginating /clients, and kicking a client (the connection is closed, the will is
published), with real MQTT clients (paho and the raw client)."""

from __future__ import annotations

import time
import uuid
from urllib.parse import quote, urlencode

import pytest

from bridge.mqtt.packets import Connack, Connect, Publish, Will
from tests.support.admin_http import AdminHttp
from tests.support.clients import RawClient, paho_client

pytestmark = pytest.mark.integration


# -- nodes, counts, clients ------------------------------------------------------------------------


def test_nodes_and_connection_count_of_a_single_node(api: AdminHttp, mqtt_port: int) -> None:
    with paho_client(mqtt_port), paho_client(mqtt_port):
        status, data = api.get("/nodes")
        assert status == 200 and data["clustered"] is False
        (me,) = data["nodes"]
        assert me["self"] and me["alive"] and me["connections"] == 2
        assert me["admin"] == f"127.0.0.1:{api.port}"
        assert 0 < me["started"] <= time.time()
        assert api.get("/connections/count") == (200, {"node": 2, "cluster": None})
    api.wait_for("/connections/count", lambda d: d["node"] == 0)
    assert api.get("/connections/count?x=1")[0] == 400
    assert api.get("/nodes?limit=1")[0] == 400


def test_client_lookup_shows_the_connection_and_its_subscriptions(
    api: AdminHttp, mqtt_port: int
) -> None:
    client_id = "dev/line 1/€"  # '/', space and non-ASCII travel percent-encoded
    before = time.time()
    with paho_client(mqtt_port, client_id, keepalive=42) as client:
        client.client.subscribe([("sensors/+/temp", 1), ("$share/grp/jobs/#", 2)])
        data = api.wait_for(
            f"/clients/{quote(client_id, safe='')}", lambda d: len(d["subscriptions"]) == 2
        )
    assert data["client_id"] == client_id and data["connected"] is True
    assert data["subscriptions"] == {"sensors/+/temp": 1, "$share/grp/jobs/#": 2}
    assert data["keepalive"] == 42
    assert data["protocol"] == "MQTT 3.1.1"
    assert data["ip"] == "127.0.0.1" and data["peer"].startswith("127.0.0.1:")
    assert data["clean_session"] is True and data["persistent"] is False
    assert before - 1 <= data["connected_at"] <= time.time()
    assert data["disconnected_at"] is None
    assert data["username"] is None
    assert data["inflight"] == 0 and data["queued"] == 0
    assert data["node"] == api.get("/health")[1]["node"]
    # A clean session ends with its connection: unknown afterwards.
    deadline = time.monotonic() + 10
    while api.client(client_id)[0] != 404:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_client_lookup_shows_the_user_name_and_the_mqtt_3_1_protocol(
    api: AdminHttp, mqtt_port: int
) -> None:
    client = RawClient(mqtt_port)
    client.send(
        Connect(
            "old-device", keepalive=0, username="alice", protocol_level=3, protocol_name="MQIsdp"
        )
    )
    assert isinstance(client.recv(), Connack)
    status, data = api.client("old-device")
    assert status == 200
    assert (data["username"], data["protocol"], data["keepalive"]) == ("alice", "MQTT 3.1", 0)
    client.disconnect()


def test_unknown_client_is_404_for_lookup_and_kick(api: AdminHttp) -> None:
    assert api.client("nobody") == (404, {"error": "unknown client 'nobody'"})
    assert api.delete("/clients/nobody") == (404, {"error": "unknown client 'nobody'"})
    assert api.get("/clients/nobody?x=1")[0] == 400


def test_offline_persistent_session_shows_its_queue_then_its_inflight_messages(
    api: AdminHttp, mqtt_port: int
) -> None:
    client_id = f"persistent-{uuid.uuid4().hex[:6]}"
    subscriber = RawClient(mqtt_port)
    subscriber.connect(client_id, clean_session=False)
    assert subscriber.subscribe("queue/#", 1) == [1]
    subscriber.disconnect()
    api.wait_for(f"/clients/{client_id}", lambda d: d["connected"] is False)
    with paho_client(mqtt_port) as publisher:
        for i in range(5):
            publisher.client.publish(f"queue/{i}", f"m{i}", qos=1).wait_for_publish(10)
    data = api.wait_for(f"/clients/{client_id}", lambda d: d["queued"] == 5)
    assert data["connected"] is False and data["persistent"] is True
    assert data["clean_session"] is False
    assert data["disconnected_at"] <= time.time()
    assert data["inflight"] == 0 and data["subscriptions"] == {"queue/#": 1}
    # Back online, not acknowledging: the five are in flight, none queued.
    again = RawClient(mqtt_port)
    assert again.connect(client_id, clean_session=False).session_present
    received = [again.recv() for _ in range(5)]
    assert all(isinstance(p, Publish) and p.qos == 1 for p in received)
    data = api.wait_for(f"/clients/{client_id}", lambda d: d["inflight"] == 5)
    assert data["queued"] == 0 and data["connected"] is True
    status, page = api.get("/clients")
    assert status == 200
    (summary,) = [c for c in page["items"] if c["client_id"] == client_id]
    assert summary["inflight"] == 5 and summary["persistent"] is True
    again.close()
    # Kicking a client that is not connected is a conflict, not an unknown client.
    api.wait_for(f"/clients/{client_id}", lambda d: d["connected"] is False)
    status, data = api.delete(f"/clients/{client_id}")
    assert status == 409 and "not connected" in data["error"]


def test_clients_are_paginated_by_client_id_each_exactly_once(
    api: AdminHttp, mqtt_port: int
) -> None:
    ids = [f"page-{i:02d}" for i in range(25)]
    clients = []
    for client_id in ids:
        client = RawClient(mqtt_port)
        client.connect(client_id)
        clients.append(client)
    api.wait_for("/connections/count", lambda d: d["node"] == 25)
    seen: list[str] = []
    after: str | None = None
    pages = []
    while True:
        query = {"limit": 10} | ({"after": after} if after is not None else {})
        status, page = api.get(f"/clients?{urlencode(query)}")
        assert status == 200
        pages.append(len(page["items"]))
        seen += [c["client_id"] for c in page["items"]]
        after = page["next"]
        if after is None:
            break
        assert after == seen[-1]
    assert pages == [10, 10, 5]
    assert seen == sorted(ids)
    status, first = api.get("/clients")
    assert [c["client_id"] for c in first["items"]] == sorted(ids) and first["next"] is None
    for bad in (
        "limit=0",
        "limit=1001",
        "limit=ten",
        "limit=-1",
        "limit=1.5",
        "limit=",
        "limit=1&limit=2",
        "page=2",
        "after=a&after=b",
    ):
        status, data = api.get(f"/clients?{bad}")
        assert status == 400, (bad, data)
        assert set(data) == {"error"}
    for client in clients:
        client.disconnect()


def test_kick_closes_the_connection_and_publishes_the_will(api: AdminHttp, mqtt_port: int) -> None:
    with paho_client(mqtt_port) as watcher:
        watcher.client.subscribe("wills/#", 1)
        api.wait_for("/subscriptions", lambda d: any(s["filter"] == "wills/#" for s in d["items"]))
        victim = RawClient(mqtt_port)
        victim.connect("victim", will=Will("wills/victim", b"gone", 1, False))
        assert api.client("victim")[1]["connected"] is True
        status, data = api.delete("/clients/victim")
        assert status == 200
        assert data["kicked"] is True and data["client_id"] == "victim"
        victim.expect_closed()
        will = watcher.get(timeout=10)
        assert (will.topic, will.payload) == ("wills/victim", b"gone")
    assert api.client("victim")[0] == 404
    assert api.delete("/clients/victim")[0] == 404
