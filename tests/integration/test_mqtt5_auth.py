"""MQTT 5.0 enhanced authentication against a real bridge: the AUTH exchange with
SCRAM-SHA-256, driven by an independent SCRAM client (scramp) over a raw v5 connection, for a
user whose credential `python -m bridge.passwd add` stored. A right password connects (and the
client verifies the server's signature), a wrong one gets CONNACK 0x86, re-authentication on the
connection works, and the plain user name/password path of the same user still does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import scramp

from bridge.mqtt.packets import Auth, Connack, Connect
from bridge.mqtt.properties import PropertyId as P
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess

METHOD = "SCRAM-SHA-256"


@pytest.fixture
def scram_node(tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    passwd = tmp_path / "passwd"
    subprocess.run(
        [sys.executable, "-m", "bridge.passwd", str(passwd), "add", "alice", "--password-stdin"],
        input=b"alice-pw\n",
        check=True,
        capture_output=True,
    )
    return bridge_factory(f"password_file={passwd}")


def _exchange(client: RawClient5, scram: scramp.ScramClient, start: Connect | Auth) -> object:
    """Send the first step, answer the server's AUTH continue; the packet that ends it."""
    client.send(start)
    challenge = client.recv()
    assert isinstance(challenge, Auth), challenge
    assert challenge.reason_code == 0x18
    assert challenge.properties[P.AUTHENTICATION_METHOD] == METHOD
    scram.set_server_first(challenge.properties[P.AUTHENTICATION_DATA].decode())
    client.send(
        Auth(
            0x18,
            {
                P.AUTHENTICATION_METHOD: METHOD,
                P.AUTHENTICATION_DATA: scram.get_client_final().encode(),
            },
        )
    )
    return client.recv()


def _connect(port: int, password: str) -> tuple[RawClient5, scramp.ScramClient, object]:
    client = RawClient5(port)
    scram = scramp.ScramClient([METHOD], "alice", password)
    connect = Connect(
        "scram-dev",
        protocol_level=5,
        properties={
            P.AUTHENTICATION_METHOD: METHOD,
            P.AUTHENTICATION_DATA: scram.get_client_first().encode(),
        },
    )
    return client, scram, _exchange(client, scram, connect)


def test_scram_sha_256_exchange_connects_and_the_client_verifies_the_server(
    scram_node: BridgeProcess,
) -> None:
    client, scram, connack = _connect(scram_node.port, "alice-pw")
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    assert connack.properties[P.AUTHENTICATION_METHOD] == METHOD
    scram.set_server_final(connack.properties[P.AUTHENTICATION_DATA].decode())  # raises if forged
    # Re-authentication on the same connection: AUTH 0x19 ... AUTH 0x00.
    again = scramp.ScramClient([METHOD], "alice", "alice-pw")
    start = Auth(
        0x19,
        {P.AUTHENTICATION_METHOD: METHOD, P.AUTHENTICATION_DATA: again.get_client_first().encode()},
    )
    done = _exchange(client, again, start)
    assert isinstance(done, Auth) and done.reason_code == 0, done
    again.set_server_final(done.properties[P.AUTHENTICATION_DATA].decode())


def test_scram_with_a_wrong_password_gets_connack_0x86_and_a_log_line(
    scram_node: BridgeProcess,
) -> None:
    client, _scram, connack = _connect(scram_node.port, "wrong")
    assert isinstance(connack, Connack) and connack.return_code == 0x86, connack
    client.expect_closed()
    scram_node.wait_for_log("SCRAM-SHA-256 failed")


def test_the_same_user_still_logs_in_with_user_name_and_password(
    scram_node: BridgeProcess,
) -> None:
    client = RawClient5(scram_node.port)
    connack = client.connect("plain-dev", username="alice", password=b"alice-pw")
    assert connack.return_code == 0


def test_a_scram_login_over_the_connection_rate_is_refused_before_any_scram_work(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    """The node's connection rate is checked before the AUTH exchange starts: a flood of SCRAM
    logins costs no key derivation. The second login within 2 s gets CONNACK 0x9F, not an AUTH
    challenge."""
    passwd = tmp_path / "passwd"
    subprocess.run(
        [sys.executable, "-m", "bridge.passwd", str(passwd), "add", "alice", "--password-stdin"],
        input=b"alice-pw\n",
        check=True,
        capture_output=True,
    )
    node = bridge_factory(
        f"password_file={passwd}", "connection_rate=0.5", "connection_rate_wait=0"
    )
    first, _scram, connack = _connect(node.port, "alice-pw")
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    second = RawClient5(node.port)
    scram = scramp.ScramClient([METHOD], "alice", "alice-pw")
    second.send(
        Connect(
            "scram-dev-2",
            protocol_level=5,
            properties={
                P.AUTHENTICATION_METHOD: METHOD,
                P.AUTHENTICATION_DATA: scram.get_client_first().encode(),
            },
        )
    )
    answer = second.recv()
    assert isinstance(answer, Connack) and answer.return_code == 0x9F, answer
    second.close()
    first.close()
