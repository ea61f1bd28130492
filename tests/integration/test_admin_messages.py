"""The admin HTTP API against a real bridge process: subscriptions, retained messages and
publishing. /subscriptions paginated and filtered by client, /retained listed, filtered and
read (UTF-8 and binary payloads), and POST /publish reaching a real subscriber and the retained
store, with every kind of bad input refused (400, 413 over max_packet_size)."""

from __future__ import annotations

import base64
import time
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.admin_http import MAX_PACKET, AdminHttp
from tests.support.clients import RawClient, paho_client

pytestmark = pytest.mark.integration


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
