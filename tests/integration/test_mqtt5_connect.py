"""MQTT 5.0 CONNECT and CONNACK against a real bridge process: the server's limits and features
in CONNACK, Assigned Client Identifier, Server Keep Alive and its enforcement, refusals with 5.0
reason codes (and the 3.1.1 return codes for the same refusals), with paho-mqtt as the v5 client
and the raw client where the test needs a client that stays silent."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.hashes import hash_password
from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5, paho5, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode


def test_connack_tells_the_servers_limits_and_features(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("receive_maximum=20", "topic_alias_maximum=7", "max_packet_size=65536")
    with paho5(node.port) as client:
        props = client.connack_properties
        assert props.ReceiveMaximum == 20
        assert props.TopicAliasMaximum == 7
        assert props.MaximumPacketSize == 65536
        assert props.RetainAvailable == 1
        assert props.WildcardSubscriptionAvailable == 1
        assert props.SubscriptionIdentifierAvailable == 1
        assert props.SharedSubscriptionAvailable == 1
        assert not hasattr(props, "ServerKeepAlive")  # the 30 s asked for is granted
        assert not hasattr(props, "AssignedClientIdentifier")  # it chose its own id
        assert client.session_present is False


def test_connack_defaults_are_receive_maximum_1000_and_topic_alias_maximum_64(
    bridge: BridgeProcess,
) -> None:
    raw = RawClient5(bridge.port)
    connack = raw.connect("defaults")
    assert connack.return_code == 0
    assert connack.properties[P.RECEIVE_MAXIMUM] == 1000
    assert connack.properties[P.TOPIC_ALIAS_MAXIMUM] == 64
    raw.disconnect()


def test_empty_client_id_is_assigned_one_that_the_client_can_then_resume(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port, "", session_expiry=60) as first:
        assigned = first.connack_properties.AssignedClientIdentifier
        assert assigned
        assert first.subscribe(("assigned/#", sub_options(1))) == [1]
    with paho5(bridge.port, assigned, clean_start=False, session_expiry=60) as again:
        assert again.session_present is True
        assert not hasattr(again.connack_properties, "AssignedClientIdentifier")
        with paho5(bridge.port) as publisher:
            publisher.publish("assigned/x", b"for the assigned id", qos=1)
        message = again.get()
        assert (message.topic, message.payload) == ("assigned/x", b"for the assigned id")


def test_two_clients_with_empty_client_ids_get_different_identifiers(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port, "") as one, paho5(bridge.port, "") as two:
        first = one.connack_properties.AssignedClientIdentifier
        second = two.connack_properties.AssignedClientIdentifier
        assert first and second and first != second
        assert one.disconnects.empty() and two.disconnects.empty()


@pytest.mark.parametrize(("asked", "granted"), [(0, 60), (61, 60), (3600, 60)])
def test_server_keep_alive_is_sent_when_the_client_asks_0_or_more_than_max_keepalive(
    bridge_factory: Callable[..., BridgeProcess], asked: int, granted: int
) -> None:
    node = bridge_factory("max_keepalive=60")
    with paho5(node.port, keepalive=asked) as client:
        assert client.connack_properties.ServerKeepAlive == granted


def test_keepalive_within_max_keepalive_is_granted_without_server_keep_alive(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("max_keepalive=60")
    with paho5(node.port, keepalive=60) as client:
        assert not hasattr(client.connack_properties, "ServerKeepAlive")


def test_server_keep_alive_is_enforced_a_silent_client_gets_disconnect_0x8D(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("max_keepalive=1")
    silent = RawClient5(node.port, timeout=6)
    connack = silent.connect("silent", keepalive=0)  # asks for no keepalive at all
    assert connack.properties[P.SERVER_KEEP_ALIVE] == 1
    connected = time.monotonic()
    disconnect = silent.expect_disconnect(R.KEEP_ALIVE_TIMEOUT, timeout=6)
    elapsed = time.monotonic() - connected
    assert 1.3 <= elapsed <= 4.0, elapsed  # 1.5 x the granted 1 s, not the 0 asked for
    assert "keepalive" in disconnect.properties[P.REASON_STRING]
    node.wait_for_log("keepalive timeout")


@pytest.fixture
def with_passwords(tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    passwd.chmod(0o600)
    return bridge_factory(f"password_file={passwd}")


def test_bad_password_gets_connack_0x86_in_mqtt5(with_passwords: BridgeProcess) -> None:
    with paho5(
        with_passwords.port, username="alice", password="wrong", expect_refusal=True
    ) as client:
        assert client.connack_reason == R.BAD_USER_NAME_OR_PASSWORD
    with paho5(with_passwords.port, username="alice", password="alice-pw") as client:
        assert client.connack_reason == 0


def test_bad_password_still_gets_connack_return_code_4_in_mqtt_3_1_1(
    with_passwords: BridgeProcess,
) -> None:
    client = RawClient(with_passwords.port)
    client.send(Connect("old-device", username="alice", password=b"wrong"))
    connack = client.recv()
    assert isinstance(connack, Connack)
    assert connack.return_code == 4
    client.expect_closed()


def test_unknown_authentication_method_gets_connack_0x8C(bridge: BridgeProcess) -> None:
    with paho5(bridge.port, expect_refusal=True, AuthenticationMethod="X-NO-SUCH-METHOD") as client:
        assert client.connack_reason == R.BAD_AUTHENTICATION_METHOD
    bridge.wait_for_log("'X-NO-SUCH-METHOD' not supported")


def test_max_connections_reached_gets_connack_0x97_in_mqtt5_and_3_in_mqtt_3_1_1(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory("max_connections=1")
    with paho5(node.port) as _only:
        with paho5(node.port, expect_refusal=True) as refused:
            assert refused.connack_reason == R.QUOTA_EXCEEDED
        old = RawClient(node.port)
        old.send(Connect("old-device"))
        connack = old.recv()
        assert isinstance(connack, Connack) and connack.return_code == 3
        old.expect_closed()
