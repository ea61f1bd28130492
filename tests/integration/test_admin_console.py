"""The API endpoints the operator console uses (bridge.operations.admin_console, admin_access)
and its static files, against a real node: the files are public and locked down, every /api/v1
call needs the token, the figures match known traffic, the searches find what they should, and
every bad input is a 4xx JSON error."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from bridge.operations.admin import ROUTES
from tests.integration.console_node import ACL_RULES, USER, connect_as_user
from tests.integration.console_node import admin_node as admin_node  # the fixture
from tests.support.admin_http import AdminHttp
from tests.support.clients import RawClient

pytestmark = [pytest.mark.integration]


def raw_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_console_files_are_public_and_locked_down_while_its_api_needs_the_token(
    api: AdminHttp,
) -> None:
    status, headers, _ = raw_get(api.port, "/console")
    assert (status, headers["Location"]) == (308, "/console/")
    status, headers, body = raw_get(api.port, "/console/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'data-testid="token"' in body
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'self' covers it
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    for name, content_type in (("app.js", "text/javascript"), ("console.css", "text/css")):
        status, headers, _ = raw_get(api.port, f"/console/{name}")
        assert (status, headers["Content-Type"]) == (200, f"{content_type}; charset=utf-8")
    for path in ("/console/missing.js", "/console/.hidden.js", "/console/README"):
        status, headers, body = raw_get(api.port, path)
        assert status == 404 and json.loads(body)["error"].startswith("no such console file")
    status, _, body = raw_get(api.port, "/console/..%2Fadmin.py")
    assert status == 404 and "error" in json.loads(body)
    for route in ROUTES:
        if route.part in ("console", "access") and not route.public:
            assert api.get(route.path, token=None)[0] == 401, route.path


def test_stats_count_known_traffic_and_match_the_node_endpoints(
    api: AdminHttp, mqtt_port: int
) -> None:
    subscriber = RawClient(mqtt_port)
    subscriber.connect("stats-sub")
    assert subscriber.subscribe("console/#", 1) == [1]
    publisher = RawClient(mqtt_port)
    publisher.connect("stats-pub")
    for packet_id in (1, 2, 3):
        publisher.publish("console/x", b"12345", qos=1, packet_id=packet_id, retain=packet_id == 1)
    for _ in range(3):
        subscriber.recv()
    stats = api.wait_for("/stats", lambda d: d["totals"]["messages_out"] == 3)
    totals = stats["totals"]
    assert stats["clustered"] is False and stats["complete"] is True
    assert len(stats["nodes"]) == 1 and stats["nodes"][0]["stats"] == totals
    assert {k: totals[k] for k in ("connections", "sessions", "subscriptions", "retained")} == {
        "connections": 2,
        "sessions": 2,
        "subscriptions": 1,
        "retained": 1,
    }
    assert totals["messages_in"] == 3 and totals["store_latency_count"] == 3
    assert totals["store_latency_sum"] > 0 and totals["bytes_in"] > 15
    assert api.get("/stats?scope=x") == (400, {"error": "unknown query parameter(s): scope"})


def test_client_search_by_clientid_prefix_user_name_and_address(
    api: AdminHttp, mqtt_port: int
) -> None:
    connect_as_user(mqtt_port, "meter-1")
    RawClient(mqtt_port).connect("meter-2")
    RawClient(mqtt_port).connect("other")

    def found(query: str) -> list[str]:
        status, data = api.get(f"/search/clients?{query}")
        assert status == 200 and data["errors"] == [], data
        return [item["client_id"] for item in data["items"]]

    assert found("q=meter-") == ["meter-1", "meter-2"]
    assert found("") == ["meter-1", "meter-2", "other"]
    assert found(f"q={USER}&by=username") == ["meter-1"]
    assert found("q=127.0.0.1&by=address") == ["meter-1", "meter-2", "other"]
    assert found("q=10.&by=address") == []
    data = api.get("/search/clients?q=meter&limit=1")[1]
    assert [i["client_id"] for i in data["items"]] == ["meter-1"] and data["truncated"] is True
    item = api.get("/search/clients?q=meter-1")[1]["items"][0]
    assert item["username"] == USER and item["connected"] is True and item["peer"]
    for query, message in (
        ("by=name&q=x", "by must be one of clientid, username, address, got 'name'"),
        ("by=username", "q must not be empty when searching by username"),
        ("limit=0", "limit must be an integer from 1 to 1000, got '0'"),
        ("q=a&q=b", "query parameter 'q' given more than once"),
    ):
        assert api.get(f"/search/clients?{query}") == (400, {"error": message})


def test_subscription_search_by_filter_and_by_topic_includes_shared_subscriptions(
    api: AdminHttp, mqtt_port: int
) -> None:
    for client_id, topic_filter in (
        ("a", "meters/+/power"),
        ("b", "$share/g/meters/+/power"),
        ("c", "meters/#"),
    ):
        client = RawClient(mqtt_port)
        client.connect(client_id)
        assert client.subscribe(topic_filter, 1) == [1]

    def found(query: str) -> list[tuple[str, str, str | None]]:
        status, data = api.get(f"/search/subscriptions?{query}")
        assert status == 200, data
        return [(i["client_id"], i["filter"], i["share_group"]) for i in data["items"]]

    assert found("filter=meters/%2B/power") == [
        ("a", "meters/+/power", None),
        ("b", "$share/g/meters/+/power", "g"),
    ]
    assert [c for c, _, _ in found("topic=meters/7/power")] == ["a", "b", "c"]
    assert found("topic=other") == []
    for query, status_message in (
        ("", "give exactly one of filter"),
        ("filter=a&topic=a", "give exactly one of filter"),
        ("filter=a/%23/b", "bad filter"),
        ("topic=a/%2B", "bad topic"),
    ):
        status, data = api.get(f"/search/subscriptions?{query}")
        assert status == 400 and data["error"].startswith(status_message), (query, data)


def test_retained_search_previews_payloads_cut_to_size(api: AdminHttp) -> None:
    euro = "€" * 100  # 300 bytes of UTF-8, cut inside a character at 256
    api.post("/publish", {"topic": "r/text", "payload": euro, "retain": True})
    api.post("/publish", {"topic": "r/bin", "payload": "/wCq", "payload_encoding": "base64",
                          "retain": True})  # fmt: skip
    api.post("/publish", {"topic": "other", "payload": "x", "retain": True})
    status, data = api.get("/search/retained?filter=r/%23")
    assert status == 200 and data["total"] == 2 and data["next"] is None
    items = {item["topic"]: item for item in data["items"]}
    text = items["r/text"]
    assert text["preview"] == "€" * 85 and text["truncated"] is True and text["size"] == 300
    binary = items["r/bin"]
    assert (binary["preview"], binary["preview_encoding"], binary["truncated"]) == (
        "/wCq",
        "base64",
        False,
    )
    page = api.get("/search/retained?limit=1&preview=0")[1]
    assert page["total"] == 3 and page["next"] == "other" and page["items"][0]["preview"] == ""
    for query in ("preview=4097", "preview=-1", "filter=a/%23/b", "after=x&after=y"):
        status, data = api.get(f"/search/retained?{query}")
        assert status == 400 and data["error"], query


def test_access_lists_users_and_rules_and_explains_decisions(api: AdminHttp) -> None:
    users = api.get("/access/users")[1]
    assert users["items"] == [{"username": USER, "sources": ["file"], "scram": False}]
    assert users["authenticating"] is True and users["allow_anonymous"] is True
    rules = api.get("/access/rules")[1]
    assert rules["enabled"] is True and len(rules["items"]) == ACL_RULES
    assert rules["items"][1]["text"] == "deny all subscribe secret/#"
    assert rules["items"][1]["source"].endswith("acl.conf:2")

    def explained(query: str) -> dict[str, Any]:
        status, data = api.get(f"/access/explain?{query}")
        assert status == 200, data
        return data

    allowed = explained("clientid=m7&topic=meters/m7/power")
    assert allowed["allowed"] is True and allowed["deciding_rule"] == 2
    assert [s["outcome"] for s in allowed["steps"]][:3] == ["not this client", "other action",
                                                          "decides"]  # fmt: skip
    denied = explained("clientid=m7&topic=meters/m8/power")
    assert denied["allowed"] is False and denied["reason"] == "no rule applies: denied"
    by_user = explained(f"clientid=m7&username={USER}&topic=meters/m8/power")
    assert by_user["allowed"] is True and by_user["deciding_rule"] == 0
    shared = explained("clientid=m7&topic=%24share/g/secret/x&action=subscribe")
    assert shared["checked"] == "secret/x" and shared["allowed"] is False
    wide = explained("clientid=m7&topic=%23&action=subscribe")
    assert wide["allowed"] is True and wide["may_filter_deliveries"] == [1]
    for query, message in (
        ("topic=a", "clientid is required"),
        ("clientid=c", "topic is required"),
        ("clientid=c&topic=a&action=read", "action must be publish or subscribe, got 'read'"),
        ("clientid=c&topic=a/%2B", "bad topic: "),
        ("clientid=c&topic=a/%23/b&action=subscribe", "bad filter: "),
    ):
        status, data = api.get(f"/access/explain?{query}")
        assert status == 400 and data["error"].startswith(message), (query, data)


def test_answers_have_the_fields_their_schemas_describe(api: AdminHttp, mqtt_port: int) -> None:
    schemas = api.get("/openapi.json", token=None)[1]["components"]["schemas"]
    client = RawClient(mqtt_port)
    client.connect("described")
    assert client.subscribe("d/#", 0) == [0]
    api.post("/publish", {"topic": "d/t", "payload": "p", "retain": True})
    answers = {
        "Stats": api.get("/stats")[1],
        "NodeStats": api.get("/stats")[1]["totals"],
        "ClientSearch": api.get("/search/clients")[1],
        "ClientMatch": api.get("/search/clients")[1]["items"][0],
        "SubscriptionSearch": api.get("/search/subscriptions?filter=d/%23")[1],
        "SubscriptionMatch": api.get("/search/subscriptions?filter=d/%23")[1]["items"][0],
        "RetainedPreviewPage": api.get("/search/retained")[1],
        "RetainedPreview": api.get("/search/retained")[1]["items"][0],
        "UserPage": api.get("/access/users")[1],
        "AclRules": api.get("/access/rules")[1],
        "AclRule": api.get("/access/rules")[1]["items"][0],
        "AclExplanation": api.get("/access/explain?clientid=c&topic=t")[1],
    }
    for name, answer in answers.items():
        assert set(answer) == set(schemas[name]["properties"]), name
