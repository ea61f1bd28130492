"""A session belongs to the identity that made it, on a real bridge process with a password file
and an ACL: another user with its ClientId is refused (3.1.1 return code 5, 5.0 reason 0x87),
gets nothing, and neither resumes the session nor kicks the owner's connection; the owner still
gets what was queued for her; the binding survives a restart and ends with the session; and
`use_username_as_clientid` gives each user the ClientId of its name."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import Pingreq, Pingresp, Publish
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.identities import (
    access_settings,
    assert_closed_with_nothing_delivered,
    connect_5,
    connect_311,
    publish_to_alice,
)
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration


def _secured(tmp_path: Path, factory: Callable[..., BridgeProcess], *extra: str) -> BridgeProcess:
    return factory(*access_settings(tmp_path), *extra)


@pytest.fixture
def node(tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    """A bridge with alice's and mallory's password file and ACL; anonymous clients refused."""
    return _secured(tmp_path, bridge_factory, "allow_anonymous=false")


def test_another_user_with_the_client_id_of_a_311_session_is_refused_and_the_owner_gets_her_message(
    node: BridgeProcess,
) -> None:
    alice, connack = connect_311(node.port, "alice-phone", "alice", clean=False)
    assert connack.return_code == 0
    assert alice.subscribe("alice/#", 1) == [1]
    alice.disconnect()
    publish_to_alice(node.port, b"salary")

    # Resuming (clean session 0) and starting afresh (1, which would wipe her session) alike.
    for clean in (False, True):
        mallory, connack = connect_311(node.port, "alice-phone", "mallory", clean=clean)
        assert (connack.return_code, connack.session_present) == (5, False)
        assert_closed_with_nothing_delivered(mallory)

    alice, connack = connect_311(node.port, "alice-phone", "alice", clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    message = alice.recv()
    assert isinstance(message, Publish), message
    assert (message.topic, message.payload) == ("alice/bank", b"salary")
    alice.disconnect()
    text = node.log_text()
    assert "client alice-phone from" in text
    assert "its session belongs to user 'alice', not to user 'mallory'" in text


def test_another_user_with_the_client_id_of_a_5_session_is_refused_with_0x87(
    node: BridgeProcess,
) -> None:
    alice, connack = connect_5(node.port, "alice-tablet", "alice")
    assert connack.return_code == 0
    alice.subscribe("alice/#", 1)
    alice.disconnect()
    publish_to_alice(node.port, b"invoice")

    for clean in (False, True):
        mallory, connack = connect_5(node.port, "alice-tablet", "mallory", clean=clean)
        assert connack.return_code == ReasonCode.NOT_AUTHORIZED
        assert not connack.session_present
        assert "another identity" in connack.properties[PropertyId.REASON_STRING]
        assert "alice" not in connack.properties[PropertyId.REASON_STRING]
        assert_closed_with_nothing_delivered(mallory)

    alice, connack = connect_5(node.port, "alice-tablet", "alice", clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    message = alice.recv_publish()
    assert (message.topic, message.payload) == ("alice/bank", b"invoice")
    alice.acknowledge(message)
    alice.disconnect()


def test_a_live_connection_is_not_kicked_by_another_users_connect(node: BridgeProcess) -> None:
    alice, connack = connect_311(node.port, "alice-laptop", "alice")
    assert connack.return_code == 0
    mallory, connack = connect_311(node.port, "alice-laptop", "mallory")
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(mallory)
    alice.send(Pingreq())
    assert isinstance(alice.recv(), Pingresp)
    assert alice.subscribe("alice/#", 1) == [1]
    alice.disconnect()
    assert "taken over" not in node.log_text()


def test_the_binding_survives_a_restart_of_the_node(node: BridgeProcess) -> None:
    alice, connack = connect_311(node.port, "alice-watch", "alice", clean=False)
    assert alice.subscribe("alice/#", 1) == [1]
    alice.disconnect()
    node.stop()
    node.start()
    mallory, connack = connect_311(node.port, "alice-watch", "mallory", clean=False)
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(mallory)
    alice, connack = connect_311(node.port, "alice-watch", "alice", clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    alice.disconnect()


def test_a_session_made_anonymously_is_refused_to_a_user_and_kept_for_anonymous_clients(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = _secured(tmp_path, bridge_factory, "allow_anonymous=true")
    anonymous, connack = connect_311(node.port, "lobby-panel", None, clean=False)
    assert connack.return_code == 0
    anonymous.disconnect()
    alice, connack = connect_311(node.port, "lobby-panel", "alice", clean=False)
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(alice)
    anonymous, connack = connect_311(node.port, "lobby-panel", None, clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    anonymous.disconnect()
    assert "its session belongs to anonymous, not to user 'alice'" in node.log_text()


def _connects_within(attempt: Callable[[], int], timeout: float = 10.0) -> int:
    """Retry `attempt` (a CONNECT's return code) until it is accepted or `timeout` passes: a
    session ends just after its client leaves, or once its expiry passes."""
    deadline = time.monotonic() + timeout
    while True:
        code = attempt()
        if code == 0 or time.monotonic() > deadline:
            return code
        time.sleep(0.1)


def test_a_client_id_is_free_for_another_user_once_its_session_ended(
    node: BridgeProcess,
) -> None:
    def as_mallory(client_id: str) -> int:
        client, connack = connect_311(node.port, client_id, "mallory")
        client.close()
        return connack.return_code

    # A clean session ends with its connection.
    alice, _ = connect_311(node.port, "shared-kiosk", "alice")
    alice.disconnect()
    assert _connects_within(lambda: as_mallory("shared-kiosk")) == 0

    # A 5.0 session ends when its expiry passes.
    alice5, connack = connect_5(node.port, "rental-car", "alice", expiry=1)
    assert connack.return_code == 0
    alice5.disconnect()
    assert _connects_within(lambda: as_mallory("rental-car")) == 0


def test_use_username_as_clientid_gives_each_user_the_client_id_of_its_name(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    # Anonymous clients allowed, so that the one below is refused for having no user name.
    node = _secured(
        tmp_path, bridge_factory, "use_username_as_clientid=true", "allow_anonymous=true"
    )
    alice, connack = connect_5(node.port, "whatever-she-sends", "alice", clean=True)
    assert connack.return_code == 0
    assert connack.properties[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] == "alice"
    assert alice.subscribe("alice/#", 1) == [0x01]
    alice.disconnect()

    # mallory sending "alice" gets the ClientId "mallory": she neither takes nor disturbs alice's.
    mallory, connack = connect_311(node.port, "alice", "mallory", clean=False)
    assert (connack.return_code, connack.session_present) == (0, False)
    mallory.disconnect()
    alice, connack = connect_311(node.port, "another-id", "alice", clean=False)
    assert (connack.return_code, connack.session_present) == (0, True)
    alice.disconnect()

    anonymous, connack = connect_311(node.port, "anon", None)
    assert connack.return_code == 5
    assert_closed_with_nothing_delivered(anonymous)
    assert "use_username_as_clientid: a client without a user name is refused" in node.log_text()
