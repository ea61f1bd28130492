"""The bounds on a client before its CONNACK, one at a time on a real bridge process: sockets over
the per-address limit are closed at once while other addresses log in; bytes past
`max_unauthenticated_bytes` get CONNACK 0x95 (3.1.1: 3); a client that pipelines within the
budget loses nothing; `connect_timeout` covers a SCRAM exchange the client never finishes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import scramp

from bridge.access.hashes import hash_password
from bridge.mqtt import codec
from bridge.mqtt.packets import Auth, Connack, Connect, Publish, Suback, Subscribe, Subscription
from bridge.mqtt.properties import PropertyId as P
from tests.integration.test_listener_guards import admin, metric, wait_metric
from tests.support.admin_http import AdminHttp
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess, require_loopback_alias

pytestmark = pytest.mark.integration


@pytest.fixture
def passwd(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    path.chmod(0o600)
    return path


def from_address(port: int, source: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    return sock


def test_sockets_over_the_per_address_limit_are_closed_at_once_and_other_addresses_log_in(
    passwd: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    factory = admin(bridge_factory, f"password_file={passwd}", "max_unauthenticated_per_address=2")
    node = factory()
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    try:
        held = [from_address(node.port, "127.0.0.2") for _ in range(2)]
    except OSError as exc:
        require_loopback_alias(f"127.0.0.2 is not a loopback alias here: {exc}")
    extra = from_address(node.port, "127.0.0.2")
    started = time.monotonic()
    assert extra.recv(10) == b"", "the socket over the limit should be closed, unread"
    assert time.monotonic() - started < 2.0
    node.wait_for_log("max_unauthenticated_per_address=2")
    wait_metric(api, "unauthenticated_refused_total", 1)
    assert metric(api, "unauthenticated_sockets") == 2
    client = RawClient(node.port)
    client.send(Connect("alice-1", username="alice", password=b"alice-pw"))
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    for sock in (*held, extra):
        sock.close()
    wait_metric(api, "unauthenticated_sockets", 0)


def test_bytes_past_the_budget_before_connack_get_connack_0x95_in_v5_and_3_in_3_1_1(
    passwd: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = bridge_factory(f"password_file={passwd}", "max_unauthenticated_bytes=2048")
    big = Publish("t", b"x" * 4096)
    v5 = RawClient5(node.port)
    connect = Connect("v5", username="alice", password=b"alice-pw", protocol_level=5)
    v5.send_bytes(codec.encode(connect, 5) + codec.encode(big, 5))
    connack = v5.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0x95, connack
    assert "max_unauthenticated_bytes=2048" in connack.properties[P.REASON_STRING]
    v5.expect_closed()
    old = RawClient(node.port)
    old.send_bytes(
        codec.encode(Connect("v4", username="alice", password=b"alice-pw")) + codec.encode(big)
    )
    connack = old.recv()
    assert isinstance(connack, Connack) and connack.return_code == 3, connack
    old.expect_closed()
    node.wait_for_log("sent more than max_unauthenticated_bytes=2048 before its CONNACK")


def test_packets_pipelined_behind_a_connect_within_the_budget_are_all_handled(
    passwd: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = bridge_factory(f"password_file={passwd}")
    client = RawClient(node.port)
    client.send_bytes(
        codec.encode(Connect("pipe", username="alice", password=b"alice-pw"))
        + codec.encode(Subscribe(1, [Subscription("pipe/t", 1)]))
        + codec.encode(Publish("pipe/t", b"hello", 1, packet_id=7))
    )
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    seen = [client.recv() for _ in range(3)]  # SUBACK, PUBACK and the message, in some order
    assert any(isinstance(p, Suback) for p in seen), seen
    assert any(isinstance(p, Publish) and p.payload == b"hello" for p in seen), seen


def test_connect_timeout_covers_a_scram_exchange_the_client_never_finishes(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    import subprocess
    import sys

    path = tmp_path / "scram-passwd"
    subprocess.run(
        [sys.executable, "-m", "bridge.passwd", str(path), "add", "alice", "--password-stdin"],
        input=b"alice-pw\n",
        check=True,
        capture_output=True,
    )
    node = bridge_factory(f"password_file={path}", "connect_timeout=1")
    client = RawClient5(node.port, timeout=10)
    scram = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    started = time.monotonic()
    client.send(
        Connect(
            "stalling",
            protocol_level=5,
            properties={
                P.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
                P.AUTHENTICATION_DATA: scram.get_client_first().encode(),
            },
        )
    )
    challenge = client.recv()
    assert isinstance(challenge, Auth) and challenge.reason_code == 0x18, challenge
    # The client never answers: the deadline counted from the accept ends the login.
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0x89, connack
    client.expect_closed()
    assert time.monotonic() - started < 5.0
    node.wait_for_log("login not decided within connect_timeout=1.0 s")


def test_failed_logins_count_for_flapping_so_a_guesser_keeping_its_client_id_is_banned(
    passwd: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = bridge_factory(
        f"password_file={passwd}", "flapping_max_connects=2", "login_failure_delay=0"
    )
    codes = []
    for _ in range(3):
        client = RawClient(node.port)
        client.send(Connect("guesser", username="alice", password=b"guess"))
        connack = client.recv()
        assert isinstance(connack, Connack), connack
        codes.append(connack.return_code)
        client.expect_closed()
    assert codes == [4, 4, 5], codes  # bad user name or password twice, then banned
    node.wait_for_log("banned by clientid 'guesser'; flapping")
    # The ban names the ClientId: the right password under it is refused too.
    client = RawClient(node.port)
    client.send(Connect("guesser", username="alice", password=b"alice-pw"))
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 5, connack


def test_failed_logins_do_not_count_for_flapping_when_turned_off(
    passwd: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    node = bridge_factory(
        f"password_file={passwd}",
        "flapping_max_connects=2",
        "login_failure_delay=0",
        "flapping_failed_logins=false",
    )
    for _ in range(3):
        client = RawClient(node.port)
        client.send(Connect("guesser", username="alice", password=b"guess"))
        connack = client.recv()
        assert isinstance(connack, Connack) and connack.return_code == 4, connack
        client.expect_closed()


def test_logins_beyond_the_queue_are_answered_server_busy_at_once(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    path = tmp_path / "argon2-passwd"
    path.write_text(f"alice:{hash_password('alice-pw')}\n")  # Argon2id: tens of ms per check
    path.chmod(0o600)
    factory = admin(
        bridge_factory,
        f"password_file={path}",
        "login_queue=1",
        "login_failure_delay=0",
    )
    node = factory()
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    clients = [RawClient(node.port) for _ in range(10)]
    connect = codec.encode(Connect("busy", username="alice", password=b"wrong"))
    for client in clients:
        client.send_bytes(connect)
    codes = []
    for client in clients:
        connack = client.recv()
        assert isinstance(connack, Connack), connack
        codes.append(connack.return_code)
    # Two checks run, one waits, the rest are told "server unavailable" (3.1.1's word for 0x89).
    assert codes.count(4) >= 3 and codes.count(3) >= 1, codes
    assert codes.count(3) + codes.count(4) == len(codes), codes
    wait_metric(api, "logins_busy_total", codes.count(3))
    node.wait_for_log("login not checked: 1 password checks wait (login_queue=1)")
