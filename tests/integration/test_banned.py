"""Banned clients and flapping detection on one real bridge process, with real clients: a ban by
ClientId, user name or address refuses CONNECT (5.0: 0x8A, 3.1.1: 5) with a log line; a client
connected when it gets banned is kicked (5.0: DISCONNECT 0x98); lifting the ban lets it back;
bad ban requests get 4xx JSON errors; the bans survive a kill -9 of the node (the bans file);
a client that connects too often is banned, logged and counted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import Connect
from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import TOKEN, AdminHttp, start_admin_node
from tests.support.clients import RawClient, paho_client
from tests.support.mqtt5 import connect_5, paho5
from tests.support.processes import BridgeProcess, free_port

pytestmark = pytest.mark.integration

NOT_AUTHORIZED_311 = 5


def connect_311(port: int, client_id: str, username: str | None = None) -> int:
    """CONNECT at 3.1.1; the CONNACK return code (the connection is closed after)."""
    client = RawClient(port)
    client.send(Connect(client_id, username=username, password=b"pw" if username else None))
    code = int(client.recv().return_code)
    client.close()
    return code


def test_a_ban_by_clientid_username_or_address_refuses_connect_until_it_is_lifted(
    admin_node: tuple[BridgeProcess, AdminHttp],
) -> None:
    node, api = admin_node
    port = node.port
    status, ban = api.post("/banned", {"clientid": "bad/1", "seconds": 600, "reason": "noisy"})
    assert status == 201, ban
    assert ban["kind"] == "clientid" and ban["value"] == "bad/1" and ban["by"] == "admin"
    assert 0 < ban["seconds_left"] <= 600 and ban["reason"] == "noisy"

    assert connect_311(port, "bad/1") == NOT_AUTHORIZED_311
    assert connect_5(port, "bad/1") == ReasonCode.BANNED
    with paho5(port, "bad/1", expect_refusal=True) as refused:
        assert refused.connack_reason == ReasonCode.BANNED
    node.wait_for_log("refused: ClientId 'bad/1' banned by clientid 'bad/1'; noisy")
    assert connect_311(port, "good") == 0

    assert api.post("/banned", {"username": "mallory", "seconds": 600})[0] == 201
    assert connect_311(port, "any", username="mallory") == NOT_AUTHORIZED_311
    assert connect_311(port, "any", username="alice") == 0

    assert api.delete("/banned/clientid/bad%2F1") == (
        200,
        {"lifted": True, "kind": "clientid", "value": "bad/1"},
    )
    assert connect_5(port, "bad/1") == ReasonCode.SUCCESS
    assert api.delete("/banned/clientid/bad%2F1")[0] == 404

    # An address ban: everybody here comes from 127.0.0.1.
    status, ban = api.post("/banned", {"address": "127.0.0.0/8", "seconds": 600})
    assert status == 201 and ban["value"] == "127.0.0.0/8"
    with paho_client(port, client_id="from-loopback") as refused_311:
        assert str(refused_311.connack_rc[0]) == "Not authorized"  # paho's word for code 5
    assert connect_5(port, "anyone") == ReasonCode.BANNED
    assert api.delete("/banned/address/127.0.0.0/8")[0] == 200  # the '/' may stay unencoded
    assert connect_5(port, "anyone") == ReasonCode.SUCCESS
    _status, metrics = api.get("/metrics")
    assert "mqtt_bridge_banned_connects_total 6.0" in metrics


def test_a_connected_client_that_gets_banned_is_kicked(
    admin_node: tuple[BridgeProcess, AdminHttp],
) -> None:
    node, api = admin_node
    old = RawClient(node.port)
    assert old.connect("victim-311").return_code == 0
    with paho5(node.port, "victim-5", username="eve", password="x") as victim:
        assert api.post("/banned", {"username": "eve", "seconds": 60})[0] == 201
        reason, _props = victim.wait_disconnect()
        assert reason == ReasonCode.ADMINISTRATIVE_ACTION
        assert api.post("/banned", {"clientid": "victim-311", "seconds": 60})[0] == 201
        old.expect_closed()
    node.wait_for_log("client victim-5 (127.0.0.1:")
    assert "kicked: banned" in node.log_text()
    assert api.client("victim-5")[0] == 404  # a clean session: gone with its connection
    _status, metrics = api.get("/metrics")
    assert "mqtt_bridge_banned_kicks_total 2.0" in metrics


def test_bans_are_listed_read_replaced_and_paged(api: AdminHttp) -> None:
    for body in (
        {"clientid": "c1", "seconds": 60},
        {"username": "u1", "seconds": 60},
        {"address": "2001:DB8::1/128", "seconds": 60},
        {"address": "10.0.0.0/8", "seconds": 60},
    ):
        assert api.post("/banned", body)[0] == 201
    status, replaced = api.post("/banned", {"clientid": "c1", "seconds": 3600, "reason": "again"})
    assert status == 200 and replaced["seconds_left"] > 60 and replaced["reason"] == "again"

    status, listing = api.get("/banned")
    assert status == 200 and listing["next"] is None
    assert [(b["kind"], b["value"]) for b in listing["items"]] == [
        ("address", "10.0.0.0/8"),
        ("address", "2001:db8::1"),
        ("clientid", "c1"),
        ("username", "u1"),
    ]
    first = api.get("/banned?limit=3")[1]
    assert len(first["items"]) == 3 and first["next"] == "clientid:c1"
    rest = api.get(f"/banned?limit=3&after={first['next']}")[1]
    assert [b["value"] for b in rest["items"]] == ["u1"] and rest["next"] is None
    assert [b["value"] for b in api.get("/banned?kind=address")[1]["items"]] == [
        "10.0.0.0/8",
        "2001:db8::1",
    ]
    assert api.get("/banned/address/2001:db8:0::1")[1]["value"] == "2001:db8::1"
    assert api.get("/banned/username/nobody")[0] == 404


def test_ban_answers_are_described_by_the_documents_schemas(api: AdminHttp) -> None:
    schemas = api.get("/openapi.json", token=None)[1]["components"]["schemas"]
    answers = {
        "Ban": api.post("/banned", {"clientid": "described", "seconds": 5})[1],
        "BanPage": api.get("/banned")[1],
        "BanLifted": api.delete("/banned/clientid/described")[1],
    }
    for name, answer in answers.items():
        assert set(answer) == set(schemas[name]["properties"]), name
    assert set(answers["BanPage"]["items"][0]) == set(schemas["Ban"]["properties"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "body is not a JSON object"),
        (b"[1, 2]", "body is not a JSON object"),
        (b'{"ip": "10.0.0.1", "seconds": 5}', "unknown field(s): ip"),
        (b'{"seconds": 5}', "a ban names exactly one of clientid, username, address"),
        (b'{"clientid": "a", "username": "b", "seconds": 5}', "exactly one of"),
        (b'{"address": "10.0.0.0/40", "seconds": 5}', "is not an IP address or CIDR"),
        (b'{"address": "10.0.0.1/8", "seconds": 5}', "did you mean 10.0.0.0/8?"),
        (b'{"clientid": "a"}', "seconds must be a positive number"),
        (b'{"clientid": "a", "seconds": 0}', "seconds must be a positive number"),
        (b'{"clientid": "a", "seconds": "5"}', "seconds must be a positive number"),
        (b'{"clientid": "a", "seconds": 1e400}', "seconds must be a positive number"),
    ],
)
def test_a_bad_ban_request_gets_a_400_naming_its_fault(
    api: AdminHttp, body: bytes, message: str
) -> None:
    status, data = api.post("/banned", body)
    assert status == 400 and set(data) == {"error"}, data
    assert message in data["error"]


def test_bad_ban_paths_and_parameters_get_4xx_json_errors(api: AdminHttp) -> None:
    assert api.get("/banned/ip/10.0.0.1") == (
        400,
        {"error": "unknown ban kind 'ip' (one of clientid, username, address)"},
    )
    status, data = api.delete("/banned/address/not-an-ip")
    assert status == 400 and "not an IP address" in data["error"]
    assert api.get("/banned?kind=ip")[0] == 400
    assert api.get("/banned?limit=0")[0] == 400
    assert api.get("/banned?colour=red")[0] == 400
    status, data, _response = api.request("PUT", "/banned")
    assert status == 405 and set(data) == {"error"}
    assert api.get("/banned")[1]["items"] == []  # nothing was banned by any of these


def test_bans_of_a_single_node_survive_its_kill_9(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    admin_port = free_port()
    settings = (f"admin_listen=127.0.0.1:{admin_port}", f"admin_token={TOKEN}")
    data_dir = tmp_path / "single"
    node = bridge_factory(*settings, data_dir=data_dir)
    api = AdminHttp(admin_port)
    assert api.post("/banned", {"clientid": "kept", "seconds": 3600})[0] == 201
    assert api.post("/banned", {"address": "192.0.2.0/24", "seconds": 3600})[0] == 201
    assert api.post("/banned", {"clientid": "lifted", "seconds": 3600})[0] == 201
    assert api.delete("/banned/clientid/lifted")[0] == 200
    node.kill()

    again = bridge_factory(*settings, data_dir=data_dir, port=node.port)
    listed = [(b["kind"], b["value"]) for b in api.get("/banned")[1]["items"]]
    assert listed == [("address", "192.0.2.0/24"), ("clientid", "kept")]
    assert connect_311(again.port, "kept") == NOT_AUTHORIZED_311
    assert connect_311(again.port, "lifted") == 0


def test_a_client_connecting_too_often_is_banned_for_flapping_logged_and_counted(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = start_admin_node(
        bridge_factory,
        f"admin_token={TOKEN}",
        "flapping_max_connects=3",
        "flapping_window=600",
        "flapping_ban_seconds=900",
    )
    for _ in range(3):
        assert connect_5(node.port, "flapper") == ReasonCode.SUCCESS
    assert connect_311(node.port, "steady") == 0
    assert connect_5(node.port, "flapper") == ReasonCode.BANNED  # the 4th within the window
    assert connect_311(node.port, "flapper") == NOT_AUTHORIZED_311
    assert connect_311(node.port, "steady") == 0  # others are not affected

    status, ban = api.get("/banned/clientid/flapper")
    assert status == 200 and ban["by"] == "flapping" and 0 < ban["seconds_left"] <= 900
    assert "more than 3 connects in 600 s" in ban["reason"]
    node.wait_for_log("banned clientid 'flapper' for 900 s (flapping)")
    _status, metrics = api.get("/metrics")
    assert "mqtt_bridge_flapping_bans_total 1.0" in metrics
    assert "mqtt_bridge_banned_connects_total 2.0" in metrics

    assert api.delete("/banned/clientid/flapper")[0] == 200
    assert connect_5(node.port, "flapper") == ReasonCode.SUCCESS  # counted afresh
