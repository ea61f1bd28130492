"""The reasons a real bridge process gives a v5 client when it ends the connection: a session
taken over (0x8E), an administrator's kick (0x98), the node shutting down (0x8B, with the Server
Reference to use instead when one is configured). A 3.1.1 client is closed without a
DISCONNECT, which 3.1.1 does not let a server send. paho-mqtt is the v5 client (it reports the
server's DISCONNECT reason and properties); the raw client checks the 3.1.1 wire."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import TOKEN, start_admin_node
from tests.support.clients import RawClient
from tests.support.mqtt5 import paho5, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

R = ReasonCode


def test_session_taken_over_by_a_second_connection_gets_disconnect_0x8E(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port, "twin") as first, paho5(bridge.port, "twin") as second:
        reason, props = first.wait_disconnect()
        assert reason == R.SESSION_TAKEN_OVER
        assert "taken over" in props.ReasonString
        assert second.disconnects.empty()
        assert second.subscribe(("twin/#", sub_options(1))) == [1]  # the new one works


def test_session_taken_over_from_a_3_1_1_connection_by_a_v5_one_closes_the_old_one(
    bridge: BridgeProcess,
) -> None:
    old = RawClient(bridge.port)
    assert old.connect("upgraded").return_code == 0
    with paho5(bridge.port, "upgraded") as new:
        old.expect_closed()  # no DISCONNECT: a 3.1.1 decoder would fail on one
        assert new.disconnects.empty()


def test_admin_kick_gets_disconnect_0x98(bridge_factory: Callable[..., BridgeProcess]) -> None:
    node, api = start_admin_node(bridge_factory, f"admin_token={TOKEN}")
    with paho5(node.port, "kicked") as client:
        api.wait_for("/clients/kicked", lambda d: d["connected"] is True)
        status, data = api.delete("/clients/kicked")
        assert status == 200 and data["kicked"] is True
        reason, _props = client.wait_disconnect()
        assert reason == R.ADMINISTRATIVE_ACTION


def test_shutdown_gets_disconnect_0x8B_with_the_configured_server_reference(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("server_reference=mqtt.example.net:1883")
    with paho5(node.port) as client:
        node.stop()  # SIGTERM: an orderly shutdown
        reason, props = client.wait_disconnect()
        assert reason == R.SERVER_SHUTTING_DOWN
        assert props.ServerReference == "mqtt.example.net:1883"
    assert node.proc is not None and node.proc.returncode == 0


def test_shutdown_without_server_reference_gets_disconnect_0x8B_without_one(
    bridge: BridgeProcess,
) -> None:
    old = RawClient(bridge.port)
    assert old.connect("old-device").return_code == 0
    with paho5(bridge.port) as client:
        bridge.stop()
        reason, props = client.wait_disconnect()
        assert reason == R.SERVER_SHUTTING_DOWN
        assert not hasattr(props, "ServerReference")
    old.expect_closed()  # 3.1.1: closed, no DISCONNECT
