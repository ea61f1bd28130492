"""Two users for the tests of sessions bound to identities: alice reads and writes her own
topics; mallory may write to alice's (a backend that pays her) but reads only her own. Their
password file and ACL as bridge settings, and raw clients that log in as them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.access.hashes import hash_password
from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.properties import PropertyId
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5

ACL = """\
allow user:alice    all        alice/#
allow user:mallory  publish    alice/#
allow user:mallory  subscribe  mallory/#
"""

USERS = {"alice": "alice-pw", "mallory": "mallory-pw"}


def access_settings(directory: Path) -> tuple[str, str]:
    """Write the password file and ACL into `directory`; the settings that name them."""
    passwd = directory / "passwd"
    passwd.write_text("".join(f"{u}:{hash_password(p, n=2**10)}\n" for u, p in USERS.items()))
    passwd.chmod(0o600)
    acl = directory / "acl.conf"
    acl.write_text(ACL)
    return f"password_file={passwd}", f"acl_file={acl}"


def connect_311(
    port: int, client_id: str, user: str | None, clean: bool = True
) -> tuple[RawClient, Connack]:
    """CONNECT at 3.1.1 as `user` (its password from USERS); the client and its CONNACK."""
    client = RawClient(port)
    password = USERS[user].encode() if user is not None else None
    client.send(Connect(client_id, clean, username=user, password=password))
    connack = client.recv()
    assert isinstance(connack, Connack), connack
    return client, connack


def connect_5(
    port: int, client_id: str, user: str, clean: bool = True, expiry: int = 3600
) -> tuple[RawClient5, Connack]:
    """CONNECT at 5.0 as `user` with a Session Expiry Interval; the client and its CONNACK."""
    client = RawClient5(port)
    connack = client.connect(
        client_id,
        clean,
        properties={PropertyId.SESSION_EXPIRY_INTERVAL: expiry},
        username=user,
        password=USERS[user].encode(),
    )
    return client, connack


def assert_closed_with_nothing_delivered(client: RawClient) -> None:
    """After its CONNACK, the connection is closed and no packet came (no message leaked)."""
    with pytest.raises(ConnectionError):
        packet = client.recv()
        raise AssertionError(f"a refused client got {packet}")


def publish_to_alice(port: int, payload: bytes) -> None:
    """mallory, as the ACL lets her, publishes `payload` at QoS 1 to alice/bank (PUBACKed)."""
    pub, connack = connect_311(port, "mallory-backend", "mallory")
    assert connack.return_code == 0
    pub.publish("alice/bank", payload, qos=1, packet_id=1)
    pub.disconnect()
