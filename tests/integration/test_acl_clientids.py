"""ClientId prefixes bound to users by the ACL (`clientid user:NAME PREFIX`), on a real bridge
process with real clients: a bound prefix is refused to every other identity and a bound user
to every other ClientId (MQTT 5.0: CONNACK 0x87; 3.1.1: return code 5), logged and counted;
after a reload, a client connected under a ClientId the new rules refuse is disconnected."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import TOKEN, AdminHttp, start_admin_node
from tests.support.identities import (
    ACL,
    access_settings,
    assert_closed_with_nothing_delivered,
    connect_5,
    connect_311,
)
from tests.support.processes import BridgeProcess

BOUND = ACL + "clientid user:alice alice-\n"
REBOUND = ACL + "clientid user:mallory alice-\nclientid user:mallory mallory-\n"


def bound_node(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> tuple[BridgeProcess, AdminHttp]:
    passwd, acl = access_settings(tmp_path)
    (tmp_path / "acl.conf").write_text(BOUND)
    return start_admin_node(
        bridge_factory, passwd, acl, "allow_anonymous=false", f"admin_token={TOKEN}"
    )


def counter(api: AdminHttp, name: str) -> float:
    status, text = api.get("/metrics")
    assert status == 200
    found = re.search(rf"^mqtt_bridge_{name}_total (\S+)$", text, re.MULTILINE)
    assert found, f"no mqtt_bridge_{name}_total in /metrics"
    return float(found.group(1))


def test_a_prefix_bound_to_a_user_is_refused_to_another_with_5_and_0x87(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node, api = bound_node(tmp_path, bridge_factory)
    intruder, connack = connect_311(node.port, "alice-phone", "mallory")
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(intruder)
    intruder5, connack = connect_5(node.port, "alice-tablet", "mallory")
    assert connack.return_code == ReasonCode.NOT_AUTHORIZED
    reason = connack.properties.get(PropertyId.REASON_STRING, "")
    assert "prefix" in reason and "alice" not in reason  # the owner is not named
    intruder5.expect_closed()
    node.wait_for_log("refused: the ClientId is under a prefix the ACL binds to another user")
    assert counter(api, "connections_refused_clientid_prefix") == 2

    alice, connack = connect_311(node.port, "alice-phone", "alice")
    assert connack.return_code == 0
    alice.disconnect()
    alice5, connack = connect_5(node.port, "alice-tablet", "alice")
    assert connack.return_code == ReasonCode.SUCCESS
    alice5.disconnect()


def test_a_user_bound_to_prefixes_is_refused_any_other_clientid(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node, api = bound_node(tmp_path, bridge_factory)
    client, connack = connect_311(node.port, "phone", "alice")
    assert connack.return_code == 5
    client.expect_closed()
    client5, connack = connect_5(node.port, "tablet", "alice")
    assert connack.return_code == ReasonCode.NOT_AUTHORIZED
    client5.expect_closed()
    assert counter(api, "connections_refused_clientid_prefix") == 2
    free, connack = connect_311(node.port, "phone", "mallory")  # no prefix reserves it
    assert connack.return_code == 0
    free.disconnect()


def test_clients_the_reloaded_rules_refuse_their_clientid_are_disconnected(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node, api = bound_node(tmp_path, bridge_factory)
    alice5, connack = connect_5(node.port, "alice-tablet", "alice")
    assert connack.return_code == ReasonCode.SUCCESS
    alice, connack = connect_311(node.port, "alice-phone", "alice")
    assert connack.return_code == 0
    other, connack = connect_311(node.port, "mallory-backend", "mallory")
    assert connack.return_code == 0

    (tmp_path / "acl.conf").write_text(REBOUND)
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGHUP)
    node.wait_for_log("reloaded the password and ACL files")

    alice5.expect_disconnect(ReasonCode.NOT_AUTHORIZED)
    alice.expect_closed()
    node.wait_for_log("disconnected: the ClientId is under a prefix the ACL binds to another user")
    assert counter(api, "clients_disconnected_clientid_prefix") == 2
    assert other.subscribe("mallory/inbox", 1) == [1]  # untouched: under her own prefix
    other.disconnect()
    taker, connack = connect_311(node.port, "alice-phone", "mallory")
    assert connack.return_code == 0  # the prefix is hers now
    taker.disconnect()
