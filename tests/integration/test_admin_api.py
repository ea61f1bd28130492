"""The admin HTTP API against a real bridge process: real HTTP requests, real MQTT clients (paho
and the raw client). Every endpoint with good and bad input, the token rules, pagination, kicking
(the will is published), publishing over HTTP, the OpenAPI document against the application's
routes, the generated token file, and /ready during a drain (in process, where the drain can be
held open)."""

from __future__ import annotations

import asyncio
import base64
import gc
import http.client
import json
import os
import re
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import pytest

from bridge.config import Config, load_config
from bridge.listeners.server import Server
from bridge.mqtt.packets import Connack, Connect, Publish, Will
from bridge.operations.admin import API_PREFIX, ROUTES, AdminAPI
from tests.support.clients import RawClient, paho_client
from tests.support.processes import BridgeProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

TOKEN = "admin-test-token-7f3a9c"
MAX_PACKET = 4096


class AdminHttp:
    """A blocking client of one node's admin API; every answer must be JSON (except metrics)."""

    def __init__(self, port: int, token: str | None = TOKEN) -> None:
        self.port = port
        self.token = token

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        token: str | None = "",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        """(status, decoded JSON body, response) of `method API_PREFIX+path`. `token` "" means
        this client's token, None no Authorization header."""
        sent = dict(headers or {})
        token = self.token if token == "" else token
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request(method, API_PREFIX + path, body=body, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        content_type = response.getheader("Content-Type", "")
        if content_type.startswith("application/json"):
            return response.status, json.loads(raw), response
        assert path == "/metrics" and response.status == 200, (response.status, raw[:300])
        return response.status, raw.decode(), response

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.request("GET", path, **kw)
        return status, data

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.request("DELETE", path, **kw)
        return status, data

    def post(self, path: str, payload: Any, **kw: Any) -> tuple[int, Any]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, data, _ = self.request(
            "POST", path, body, headers={"Content-Type": "application/json"}, **kw
        )
        return status, data

    def client(self, client_id: str) -> tuple[int, Any]:
        return self.get(f"/clients/{quote(client_id, safe='')}")

    def wait_for(
        self, path: str, check: Callable[[Any], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """GET `path` until it answers 200 and `check(body)` holds; the body."""
        deadline = time.monotonic() + timeout
        status, data = self.get(path)
        while not (status == 200 and check(data)):
            assert time.monotonic() < deadline, f"{path}: still {status} {data}"
            time.sleep(0.1)
            status, data = self.get(path)
        return data


def start_admin_node(
    bridge_factory: Callable[..., BridgeProcess], *settings: str
) -> tuple[BridgeProcess, AdminHttp]:
    port = free_port()
    node = bridge_factory(f"admin_listen=127.0.0.1:{port}", *settings)
    wait_for_port(port, proc=node.proc)
    return node, AdminHttp(port)


@pytest.fixture
def admin_node(bridge_factory: Callable[..., BridgeProcess]) -> tuple[BridgeProcess, AdminHttp]:
    """A node with a fixed token, /metrics behind the token and small packets."""
    return start_admin_node(
        bridge_factory,
        f"admin_token={TOKEN}",
        "metrics_public=false",
        f"max_packet_size={MAX_PACKET}",
    )


@pytest.fixture
def api(admin_node: tuple[BridgeProcess, AdminHttp]) -> AdminHttp:
    return admin_node[1]


@pytest.fixture
def mqtt_port(admin_node: tuple[BridgeProcess, AdminHttp]) -> int:
    return admin_node[0].port


def example_path(route_path: str) -> str:
    """A concrete path for a route, its parameters filled in."""
    return re.sub(r"\{[^}]+\}", "x", route_path)


# -- probes, token, errors, the OpenAPI document ---------------------------------------------------


def test_health_and_ready_answer_without_a_token(api: AdminHttp) -> None:
    status, health = api.get("/health", token=None)
    assert status == 200 and health["status"] == "ok" and health["node"]
    status, ready = api.get("/ready", token=None)
    assert status == 200 and ready == {"status": "ready", "node": health["node"]}
    assert api.get("/health?verbose=1", token=None)[0] == 400


def test_every_protected_endpoint_refuses_a_missing_or_wrong_token(api: AdminHttp) -> None:
    protected = [r for r in ROUTES if not r.public]
    assert protected
    for route in protected:
        path = example_path(route.path)
        for token, error in ((None, "missing bearer token"), ("wrong", "invalid bearer token")):
            status, data, response = api.request(route.method, path, b"{}", token=token)
            assert status == 401, (route, token, data)
            assert data == {"error": error}
            assert response.getheader("WWW-Authenticate", "").startswith("Bearer")
        status, data, _ = api.request(
            route.method, path, headers={"Authorization": f"Basic {TOKEN}"}, token=None
        )
        assert status == 401, (route, data)
        status, data, _ = api.request(route.method, path, token=TOKEN + "x")
        assert status == 401, (route, data)


def test_unknown_routes_and_methods_answer_json_errors(api: AdminHttp) -> None:
    assert api.get("/no/such/thing") == (
        404,
        {"error": f"no such endpoint: {API_PREFIX}/no/such/thing"},
    )
    status, data, response = api.request("PUT", "/publish")
    assert status == 405 and "PUT" in data["error"]
    assert response.getheader("Allow") == "POST"
    status, data, _ = api.request("POST", "/clients")
    assert status == 405 and set(data) == {"error"}
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=10)
    conn.request("GET", "/", headers={"Authorization": f"Bearer {TOKEN}"})
    response = conn.getresponse()
    assert response.status == 404
    assert json.loads(response.read()) == {"error": "no such endpoint: /"}
    conn.close()


def test_openapi_document_describes_exactly_the_routes_of_the_application(api: AdminHttp) -> None:
    status, spec = api.get("/openapi.json", token=None)
    assert status == 200 and spec["openapi"].startswith("3.1")
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    app = AdminAPI(SimpleNamespace(config=Config())).app  # type: ignore[arg-type]
    in_app = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD to every GET
        path = re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", route.resource.canonical)
        in_app.add((route.method, path))
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    in_spec = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        for method in operations
        if method in methods
    }
    assert in_app == in_spec
    assert len(in_app) == len(ROUTES)
    public = {(r.method, API_PREFIX + r.path) for r in ROUTES if r.public}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "200" in operation["responses"], (method, path)
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"\{(\w+)\}", path)), (method, path)
            if (method.upper(), path) in public:
                assert operation["security"] == []
            else:
                assert "401" in operation["responses"], (method, path)
    publish = spec["paths"][f"{API_PREFIX}/publish"]["post"]
    assert publish["requestBody"]["content"]["application/json"]["schema"]
    for ref in re.findall(r'"\$ref": "#/([^"]+)"', json.dumps(spec)):
        target = spec
        for part in ref.split("/"):
            target = target[part]  # every reference resolves


def test_json_answers_are_described_by_the_documents_schemas(
    api: AdminHttp, mqtt_port: int
) -> None:
    """The top-level fields of real answers are the ones the OpenAPI schemas require."""
    schemas = api.get("/openapi.json", token=None)[1]["components"]["schemas"]
    client = RawClient(mqtt_port)
    client.connect("described")
    answers = {
        "Client": api.get("/clients/described")[1],
        "ClientSummary": api.get("/clients")[1]["items"][0],
        "Kicked": api.delete("/clients/described")[1],
        "Health": api.get("/health")[1],
        "NodeList": api.get("/nodes")[1],
        "Node": api.get("/nodes")[1]["nodes"][0],
        "ConnectionCount": api.get("/connections/count")[1],
        "ClientPage": api.get("/clients")[1],
        "SubscriptionPage": api.get("/subscriptions")[1],
        "RetainedPage": api.get("/retained")[1],
        "PublishResult": api.post("/publish", {"topic": "s/t", "payload": "p", "retain": True})[1],
        "Error": api.get("/clients/none")[1],
    }
    for name, answer in answers.items():
        assert set(answer) == set(schemas[name]["properties"]), name
    retained = api.get("/retained/s/t")[1]
    described = set(schemas["RetainedSummary"]["properties"])
    for part in schemas["RetainedMessage"]["allOf"][1:]:
        described |= set(part["properties"])
    assert set(retained) == described


def test_metrics_need_the_token_unless_public(
    api: AdminHttp, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    assert api.get("/metrics", token=None)[0] == 401
    status, data = api.get("/metrics")
    # 404 until the server provides `metrics_text`, then the text exposition.
    assert (status, data) == (404, {"error": "metrics are not available on this node"}) or (
        status == 200 and isinstance(data, str)
    )
    _, public = start_admin_node(bridge_factory, f"admin_token={TOKEN}")
    assert public.get("/metrics", token=None)[0] in (200, 404)


def test_a_generated_token_is_written_mode_0600_and_never_logged(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "generated"
    port = free_port()
    node = bridge_factory(f"admin_listen=127.0.0.1:{port}", data_dir=data_dir)
    wait_for_port(port, proc=node.proc)
    token_file = data_dir / "admin-token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32
    api = AdminHttp(port, token)
    assert api.get("/nodes")[0] == 200
    assert api.get("/nodes", token=TOKEN)[0] == 401
    api.post("/publish", {"topic": "t", "payload": "x"})
    log = node.wait_for_log("admin API token generated into")
    assert str(token_file) in log
    assert token not in log
    node.stop()
    assert token not in node.log_text()


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


# -- subscriptions and retained messages -----------------------------------------------------------


def test_subscriptions_are_listed_paginated_and_filtered_by_client(
    api: AdminHttp, mqtt_port: int
) -> None:
    expected = []
    clients = []
    for n in range(3):
        client = RawClient(mqtt_port)
        client.connect(f"subs-{n}")
        for topic_filter, qos in ((f"a/{n}/#", 1), ("b/+", 0), ("$share/g1/c/#", 2)):
            client.subscribe(topic_filter, qos)
            group = "g1" if topic_filter.startswith("$share/") else None
            expected.append((f"subs-{n}", topic_filter, qos, group))
        clients.append(client)
    got = []
    after = None
    while True:
        query = {"limit": 2} | ({"after": after} if after else {})
        status, page = api.get(f"/subscriptions?{urlencode(query)}")
        assert status == 200 and len(page["items"]) <= 2
        got += [(s["client_id"], s["filter"], s["qos"], s["share_group"]) for s in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert got == sorted(expected)
    status, one = api.get("/subscriptions?client=subs-1")
    assert status == 200 and [s["filter"] for s in one["items"]] == sorted(
        ["a/1/#", "b/+", "$share/g1/c/#"]
    )
    assert api.get("/subscriptions?client=nobody")[0] == 404
    for bad in ("after=not-a-cursor!", "after=bm9wZQ", "limit=0", "group=g1"):
        status, data = api.get(f"/subscriptions?{bad}")
        assert status == 400, (bad, data)
    for client in clients:
        client.disconnect()


def test_retained_messages_are_listed_filtered_and_read(api: AdminHttp, mqtt_port: int) -> None:
    with paho_client(mqtt_port) as pub:
        for topic, payload, qos in (
            ("r/one", b"first", 0),
            ("r/two", b"second", 1),
            ("r/deep/three", b"\xff\x00binary", 2),
            ("other/four", b"4", 1),
        ):
            pub.client.publish(topic, payload, qos=qos, retain=True).wait_for_publish(10)
    # '#' matches no '$' topic: the node's own $SYS/... retained messages stay out.
    data = api.wait_for(f"/retained?{urlencode({'filter': '#'})}", lambda d: len(d["items"]) == 4)
    assert [r["topic"] for r in data["items"]] == sorted(
        ["r/one", "r/two", "r/deep/three", "other/four"]
    )
    status, unfiltered = api.get("/retained?limit=1000")
    assert {r["topic"] for r in data["items"]} <= {r["topic"] for r in unfiltered["items"]}
    status, page = api.get(f"/retained?{urlencode({'filter': 'r/+'})}")
    assert status == 200 and [r["topic"] for r in page["items"]] == ["r/one", "r/two"]
    status, page = api.get(f"/retained?{urlencode({'filter': 'r/#', 'limit': 2})}")
    assert [r["topic"] for r in page["items"]] == ["r/deep/three", "r/one"]
    status, rest = api.get(f"/retained?{urlencode({'filter': 'r/#', 'after': page['next']})}")
    assert [r["topic"] for r in rest["items"]] == ["r/two"] and rest["next"] is None
    two = page["items"][1]
    assert two["qos"] == 0 and two["size"] == 5 and two["published_at"] <= time.time()
    status, message = api.get("/retained/r/two")
    assert status == 200
    assert (message["payload"], message["payload_encoding"], message["qos"]) == (
        "second",
        "utf-8",
        1,
    )
    status, binary = api.get("/retained/r/deep/three")
    assert binary["payload_encoding"] == "base64"
    assert base64.b64decode(binary["payload"]) == b"\xff\x00binary"
    assert api.get("/retained/r/none") == (404, {"error": "no retained message on topic 'r/none'"})
    for bad in ("r/#/x", "r/a+", "$share/g/r/#", "", "a\x00b"):
        status, data = api.get(f"/retained?{urlencode({'filter': bad})}")
        assert status == 400, (bad, data)
    assert api.get("/retained?limit=5000")[0] == 400
    assert api.get("/retained/")[0] == 400


# -- publishing ------------------------------------------------------------------------------------


def test_publish_over_http_reaches_a_subscriber_and_is_retained(
    api: AdminHttp, mqtt_port: int
) -> None:
    with paho_client(mqtt_port) as sub:
        sub.client.subscribe("http/#", 1)
        api.wait_for("/subscriptions", lambda d: any(s["filter"] == "http/#" for s in d["items"]))
        status, data = api.post(
            "/publish", {"topic": "http/cmd", "payload": "réboot", "qos": 1, "retain": True}
        )
        assert status == 200, data
        assert data["stored"] is True and data["id"]
        assert (data["topic"], data["qos"], data["retain"]) == ("http/cmd", 1, True)
        message = sub.get(timeout=10)
        assert (message.topic, message.payload, message.qos) == ("http/cmd", "réboot".encode(), 1)
        status, data = api.post(
            "/publish",
            {
                "topic": "http/raw",
                "payload": base64.b64encode(b"\x00\x01").decode(),
                "payload_encoding": "base64",
            },
        )
        assert status == 200 and data["qos"] == 0
        message = sub.get(timeout=10)
        assert (message.topic, message.payload) == ("http/raw", b"\x00\x01")
    with paho_client(mqtt_port) as later:
        later.client.subscribe("http/cmd", 1)
        retained = later.get(timeout=10)
        assert retained.retain and retained.payload == "réboot".encode()
    assert api.get("/retained/http/cmd")[1]["publisher"] == "admin-api"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "body is not a JSON object"),
        (b"[1, 2]", "body is not a JSON object"),
        (b'"text"', "body is not a JSON object"),
        (b"", "body is not a JSON object"),
        ({}, "topic must be a non-empty string"),
        ({"topic": "", "payload": ""}, "topic must be a non-empty string"),
        ({"topic": 5, "payload": ""}, "topic must be a non-empty string"),
        ({"topic": "a/+", "payload": ""}, "bad topic"),
        ({"topic": "a/#", "payload": ""}, "bad topic"),
        ({"topic": "a\u0000b", "payload": ""}, "bad topic"),
        ({"topic": "$SYS/x", "payload": ""}, "reserved"),
        ({"topic": "/".join("l" * 200), "payload": ""}, "max_topic_levels"),
        ({"topic": "t"}, "payload must be a string"),
        ({"topic": "t", "payload": 5}, "payload must be a string"),
        ({"topic": "t", "payload": "x", "qos": 3}, "qos must be 0, 1 or 2"),
        ({"topic": "t", "payload": "x", "qos": "1"}, "qos must be 0, 1 or 2"),
        ({"topic": "t", "payload": "x", "qos": True}, "qos must be 0, 1 or 2"),
        ({"topic": "t", "payload": "x", "qos": 1.0}, "qos must be 0, 1 or 2"),
        ({"topic": "t", "payload": "x", "retain": "yes"}, "retain must be true or false"),
        ({"topic": "t", "payload": "x", "payload_encoding": "hex"}, "payload_encoding"),
        ({"topic": "t", "payload": "!!", "payload_encoding": "base64"}, "not valid base64"),
        ({"topic": "t", "payload": "x", "colour": "red"}, "unknown field(s): colour"),
    ],
)
def test_publish_rejects_bad_input_with_400(api: AdminHttp, body: Any, error: str) -> None:
    status, data = api.post("/publish", body)
    assert status == 400, data
    assert set(data) == {"error"} and error in data["error"]


def test_publish_rejects_payloads_over_max_packet_size(api: AdminHttp) -> None:
    status, data = api.post("/publish", {"topic": "t", "payload": "x" * (MAX_PACKET + 1)})
    assert status == 413 and "max_packet_size" in data["error"]
    status, data = api.post("/publish", {"topic": "t", "payload": "x" * MAX_PACKET})
    assert status == 200
    status, data = api.post("/publish", b'{"topic": "t", "payload": "' + b"x" * 200_000 + b'"}')
    assert status == 413 and set(data) == {"error"}
    assert api.post("/publish?qos=1", {"topic": "t", "payload": "x"})[0] == 400


# -- readiness during a drain ----------------------------------------------------------------------


def test_ready_answers_503_while_the_node_drains(tmp_path: Path) -> None:
    """In process: the drain (here: closing the store) is held open until /ready was asked, so
    the 503 is seen every time, not only when a request happens to land in a short window."""
    admin_port = free_port()
    config = load_config(
        env={},
        overrides={
            "listen": [f"127.0.0.1:{free_port()}"],
            "data_dir": str(tmp_path / "data"),
            "admin_listen": f"127.0.0.1:{admin_port}",
            "admin_token": TOKEN,
        },
    )
    base = f"http://127.0.0.1:{admin_port}{API_PREFIX}"

    async def status_of(http: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
        async with http.get(base + path) as response:
            return response.status, await response.json()

    async def scenario() -> None:
        server = Server(config)
        await server.start()
        node_stop = server.node.stop
        draining = asyncio.Event()
        release = asyncio.Event()

        async def held_stop() -> None:
            draining.set()
            await release.wait()
            await node_stop()

        server.node.stop = held_stop  # type: ignore[method-assign]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            assert (await status_of(http, "/ready"))[0] == 200
            shutdown = asyncio.get_running_loop().create_task(server.shutdown())
            try:
                await asyncio.wait_for(draining.wait(), 10)
                status, body = await status_of(http, "/ready")
                assert status == 503 and body["status"] == "not ready" and body["error"]
                assert (await status_of(http, "/health"))[0] == 200
            finally:
                release.set()
                await asyncio.wait_for(shutdown, 20)
            with pytest.raises(aiohttp.ClientConnectionError):
                await status_of(http, "/health")

    thresholds = gc.get_threshold()
    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()  # Server.start froze this test process's heap
        gc.set_threshold(*thresholds)
