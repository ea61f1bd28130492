"""Rate and connection limits on a real bridge process: a publisher over its message or byte rate
is read later and loses nothing (MQTT 3.1.1 and 5.0 with Receive Maximum, never disconnected);
CONNECTs over the node's connection rate wait for their turn or get CONNACK 0x9F / 3; the
connection limit answers 0x97 / 3; the admin API changes every limit at run time, refuses
nonsense with 400 naming the limit, and a single node keeps its overrides across a restart.

Timing is asserted only as a lower bound with a wide margin (half of what the limit allows at
most), to prove that the limit applied; nothing here depends on the machine being fast."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest

from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.reasons import ReasonCode as R
from tests.support.admin_http import TOKEN, AdminHttp
from tests.support.clients import RawClient, paho_client
from tests.support.mqtt5 import RawClient5, paho5
from tests.support.processes import REPO, BridgeProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration


def limited_node(
    bridge_factory: Callable[..., BridgeProcess], *settings: str, data_dir: Path | None = None
) -> tuple[BridgeProcess, AdminHttp]:
    """A node with the admin API (the tests' token) and these settings."""
    port = free_port()
    node = bridge_factory(
        f"admin_listen=127.0.0.1:{port}", f"admin_token={TOKEN}", *settings, data_dir=data_dir
    )
    wait_for_port(port, proc=node.proc)
    return node, AdminHttp(port)


def counter(api: AdminHttp, name: str) -> float:
    """The value of mqtt_bridge_<name> in the node's /metrics."""
    status, text = api.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(f"mqtt_bridge_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"mqtt_bridge_{name} not in /metrics")


def put_limits(api: AdminHttp, changes: Any) -> tuple[int, Any]:
    body = changes if isinstance(changes, bytes) else json.dumps(changes).encode()
    status, data, _ = api.request(
        "PUT", "/limits", body, headers={"Content-Type": "application/json"}
    )
    return status, data


@contextmanager
def watched_disconnects(client: paho.Client) -> Iterator[list[Any]]:
    """The disconnects `client` sees while the block runs (none expected)."""
    seen: list[Any] = []
    client.on_disconnect = lambda *args: seen.append(args[3])
    yield seen


def publish_and_count(
    publisher: paho.Client, subscriber_drain: Callable[..., list[Any]], count: int, **kw: Any
) -> tuple[float, int]:
    """Publish `count` QoS 1 messages (paho queues and paces them by its in-flight window)
    and wait for all of them at the subscriber: (seconds it took, messages received)."""
    payload = kw.get("payload", b"x")
    started = time.monotonic()
    for i in range(count):
        info = publisher.publish("rate/test", payload + str(i).encode(), 1)
        assert info.rc == paho.MQTT_ERR_SUCCESS
    received = subscriber_drain(count, timeout=60)
    return time.monotonic() - started, len(received)


# -- per-client publish rate -------------------------------------------------------------------


def test_a_publisher_over_its_message_rate_is_read_slower_and_loses_nothing(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory, "client_publish_rate=20")
    with paho_client(node.port) as sub, paho_client(node.port) as pub:
        sub.client.subscribe("rate/#", 1)
        time.sleep(0.3)
        with watched_disconnects(pub.client) as dropped:
            took, received = publish_and_count(pub.client, sub.drain, 100)
            assert received == 100, f"only {received} of 100 delivered"
            assert not dropped, f"the publisher was disconnected: {dropped}"
    # 100 messages at 20/s with 20 saved up and one read of paho's window (20) ahead: >= 3 s.
    assert took >= 1.5, f"100 messages at 20/s took only {took:.2f} s: not limited"
    assert counter(api, "publish_rate_pauses_total") >= 1
    assert "closing" not in node.log_text()


def test_a_v5_publisher_keeping_to_receive_maximum_is_paced_never_disconnected(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory, "client_publish_rate=20", "receive_maximum=20")
    with (
        paho5(node.port, ReceiveMaximum=2) as sub,
        paho5(node.port) as pub,
    ):
        # paho keeps at most 20 QoS 1 messages in flight: the Receive Maximum it was told.
        assert pub.connack_properties.ReceiveMaximum == 20 == pub.client.max_inflight_messages
        sub.subscribe(("rate/#", paho.SubscribeOptions(qos=1)))
        took, received = publish_and_count(pub.client, sub.drain, 80)
        assert received == 80, f"only {received} of 80 delivered"
        assert pub.disconnects.empty() and sub.disconnects.empty()
    # 80 at 20/s, 20 saved up, one window of 20 ahead: >= 2 s.
    assert took >= 1.0, f"80 messages at 20/s took only {took:.2f} s: not limited"
    assert counter(api, "publish_rate_pauses_total") >= 1
    assert "0x93" not in node.log_text() and "Receive Maximum" not in node.log_text()


def test_a_publisher_over_its_byte_rate_is_read_slower_and_loses_nothing(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, _api = limited_node(bridge_factory, "client_publish_bytes_rate=20000")
    with paho_client(node.port) as sub:
        sub.client.subscribe("rate/#", 1)
        time.sleep(0.3)
        pub = RawClient(node.port, timeout=15)
        assert pub.connect("bulky").return_code == 0
        started = time.monotonic()
        for i in range(12):  # one message a read: each waits for its PUBACK
            pub.publish("rate/bulk", b"b" * 5000, qos=1, packet_id=i + 1)
        received = sub.drain(12, timeout=30)
        took = time.monotonic() - started
        assert len(received) == 12
        pub.disconnect()
    # 60 kB at 20 kB/s with 20 kB saved up and one message ahead: >= 1.75 s.
    assert took >= 0.9, f"60 kB at 20 kB/s took only {took:.2f} s: not limited"


def test_a_publish_limit_set_through_the_api_applies_to_connected_clients_at_once(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory)
    with paho_client(node.port) as sub, paho_client(node.port) as pub:
        sub.client.subscribe("rate/#", 1)
        time.sleep(0.3)
        status, state = put_limits(api, {"client_publish_rate": 20})
        assert status == 200, state
        assert state["limits"]["client_publish_rate"] == 20 and state["scope"] == "node"
        took, received = publish_and_count(pub.client, sub.drain, 100)
        assert received == 100
        assert took >= 1.5, f"100 messages at 20/s took only {took:.2f} s: not limited"
        status, state = put_limits(api, {"client_publish_rate": None})
        assert status == 200 and state["limits"] == state["defaults"]
        assert state["overrides"] == {}
        _took, received = publish_and_count(pub.client, sub.drain, 100)
        assert received == 100
    node.wait_for_log("limits changed through the admin API: client_publish_rate=20")


# -- per-node connection rate and count --------------------------------------------------------


def test_connects_over_the_connection_rate_get_0x9f_in_mqtt5_and_3_in_mqtt_3_1_1(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    # One connection per 2 s and no waiting: the second and third CONNECT come too soon.
    node, api = limited_node(bridge_factory, "connection_rate=0.5", "connection_rate_wait=0")
    first = RawClient5(node.port)
    assert first.connect("first").return_code == 0
    v5 = RawClient5(node.port)
    connack = v5.connect("second")
    assert connack.return_code == R.CONNECTION_RATE_EXCEEDED
    v5.expect_closed()
    old = RawClient(node.port)
    old.send(Connect("third"))
    connack = old.recv()
    assert isinstance(connack, Connack) and connack.return_code == 3
    old.expect_closed()
    node.wait_for_log("refused: over connection_rate=0.5/s for more than connection_rate_wait=0 s")
    assert counter(api, "connections_rate_refused_total") == 2
    first.disconnect()


def test_connects_over_the_connection_rate_wait_for_their_turn_and_are_taken(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory, "connection_rate=2", "connection_rate_wait=10")
    clients = []
    started = time.monotonic()
    for i in range(6):
        client = RawClient5(node.port, timeout=15)
        assert client.connect(f"patient-{i}").return_code == 0
        clients.append(client)
    took = time.monotonic() - started
    # 6 connections at 2/s with 2 saved up: >= 2 s.
    assert took >= 1.0, f"6 CONNECTs at 2/s took only {took:.2f} s: not limited"
    assert counter(api, "connections_rate_delayed_total") >= 3
    assert counter(api, "connections_rate_refused_total") == 0
    for client in clients:
        client.disconnect()


def test_max_connections_changed_at_run_time_answers_0x97_and_3_then_takes_clients_again(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory)
    status, _state = put_limits(api, {"max_connections": 1})
    assert status == 200
    with paho5(node.port) as _only:
        with paho5(node.port, expect_refusal=True) as refused:
            assert refused.connack_reason == R.QUOTA_EXCEEDED
        old = RawClient(node.port)
        old.send(Connect("old-device"))
        connack = old.recv()
        assert isinstance(connack, Connack) and connack.return_code == 3
        old.expect_closed()
        node.wait_for_log("node is at max_connections=1")
        assert counter(api, "connections_over_max_total") == 2
        status, state = put_limits(api, {"max_connections": None})
        assert status == 200 and state["limits"]["max_connections"] == 0
        with paho5(node.port) as second:
            assert second.connack_reason == 0


# -- the API and the configuration -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"client_publish_rate": -1}, "client_publish_rate: must be a finite number"),
        ({"max_connections": 2.5}, "max_connections: expected a whole number"),
        ({"connection_rate": "fast"}, "connection_rate: expected a number"),
        ({"connection_rate_wait": True}, "connection_rate_wait: expected a number"),
        ({"client_publish_bytes_rate": 1e15}, "client_publish_bytes_rate: at most"),
        ({"max_conections": 5}, "max_conections: not a limit"),
        ({}, "no limit named"),
        ([1, 2], "body must be a JSON object"),
        (b"{not json", "body is not JSON"),
    ],
)
def test_nonsense_limits_through_the_api_get_400_naming_the_limit_and_change_nothing(
    bridge_factory: Callable[..., BridgeProcess], body: Any, message: str
) -> None:
    node, api = limited_node(bridge_factory, "client_publish_rate=7")
    status, data = put_limits(api, body)
    assert status == 400 and message in data["error"], data
    status, state = api.get("/limits")
    assert status == 200 and state["limits"]["client_publish_rate"] == 7
    assert state["overrides"] == {} and "Traceback" not in node.log_text()


def test_limits_need_the_token_and_take_no_query_parameters(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    _node, api = limited_node(bridge_factory)
    assert api.get("/limits", token=None)[0] == 401
    status, data = api.get("/limits?x=1")
    assert status == 400 and "unknown query parameter" in data["error"]


def test_a_single_nodes_overrides_survive_its_restart_and_delete_drops_them(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory, "connection_rate=100")
    status, _ = put_limits(api, {"client_publish_rate": 30, "connection_rate": 5})
    assert status == 200
    stored = json.loads((node.data_dir / "limits.json").read_text())
    assert stored == {"client_publish_rate": 30.0, "connection_rate": 5.0}
    node.stop()
    again, api = limited_node(bridge_factory, "connection_rate=100", data_dir=node.data_dir)
    state = api.wait_for("/limits", lambda _s: True)
    assert state["limits"]["client_publish_rate"] == 30 and state["limits"]["connection_rate"] == 5
    assert state["defaults"]["connection_rate"] == 100
    status, data, _ = api.request("DELETE", "/limits")
    assert status == 200 and data["overrides"] == {} and data["limits"] == data["defaults"]
    assert json.loads((again.data_dir / "limits.json").read_text()) == {}


def test_a_nonsense_limit_in_the_configuration_stops_the_start_naming_the_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "--set", "client_publish_rate=-5", "--print-config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "configuration error: client_publish_rate: must be a finite number" in result.stderr
