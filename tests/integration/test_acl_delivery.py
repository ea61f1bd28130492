"""The read ACL holds at every delivery, on a real bridge process: when the rules change so that
they no longer grant a filter a client subscribed to, messages on the topics it may no longer
read stop reaching it, while those it still may read go on arriving, in order; and a session
resumed under another user name is judged by that name."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import Connack, Connect, Puback, Publish
from tests.support.clients import RawClient
from tests.support.identities import access_settings, connect_311
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

NARROWER = """\
allow user:alice    subscribe  alice/public/#
allow user:mallory  publish    alice/#
"""


def test_a_subscription_the_changed_rules_no_longer_grant_delivers_only_what_they_allow(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = bridge_factory(*access_settings(tmp_path), "allow_anonymous=false")
    alice, connack = connect_311(node.port, "alice-phone", "alice", clean=False)
    assert connack.return_code == 0
    assert alice.subscribe("alice/#", 1) == [1]

    (tmp_path / "acl.conf").write_text(NARROWER)
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGHUP)
    node.wait_for_log("reloaded the password and ACL files")

    mallory, connack = connect_311(node.port, "mallory-backend", "mallory")
    assert connack.return_code == 0
    mallory.publish("alice/bank", b"no longer hers to read", qos=1, packet_id=1)
    mallory.publish("alice/public/news", b"still hers", qos=1, packet_id=2)
    mallory.disconnect()
    # Both went through the queue of alice/#, in order: the first to arrive is the second.
    message = alice.recv()
    assert isinstance(message, Publish), message
    assert (message.topic, message.payload) == ("alice/public/news", b"still hers")
    alice.disconnect()


def test_a_session_resumed_under_another_user_name_is_judged_by_that_name(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    # No authentication: sessions are not bound, and the ACL judges the user name claimed.
    acl = tmp_path / "acl.conf"
    acl.write_text("allow user:alice all alice/#\nallow user:bob subscribe alice/public/#\n")
    node = bridge_factory(f"acl_file={acl}")

    def login(client_id: str, user: str, clean: bool = False) -> RawClient:
        client = RawClient(node.port)
        client.send(Connect(client_id, clean, username=user))
        connack = client.recv()
        assert isinstance(connack, Connack) and connack.return_code == 0, connack
        return client

    alice = login("shared-panel", "alice")
    assert alice.subscribe("alice/#", 1) == [1]
    writer = login("alice-writer", "alice", clean=True)
    writer.publish("alice/first", b"hers", qos=1, packet_id=1)
    message = alice.recv()  # read as alice: her filters are cleared for this rule set
    assert isinstance(message, Publish) and message.payload == b"hers"
    alice.send(Puback(message.packet_id or 0))
    alice.disconnect()

    bob = login("shared-panel", "bob")
    writer.publish("alice/second", b"not bob's", qos=1, packet_id=2)
    writer.publish("alice/public/notice", b"bob may read this", qos=1, packet_id=3)
    writer.disconnect()
    # Both went through the queue of alice/#, in order: the first bob gets is the second.
    message = bob.recv()
    assert isinstance(message, Publish), message
    assert (message.topic, message.payload) == ("alice/public/notice", b"bob may read this")
    bob.disconnect()
