"""Safe defaults seen from outside a running node: its files are private, and with users the
$SYS client events need an ACL rule."""

from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.passwd import hash_password
from bridge.mqtt.packets import Connack, Connect
from tests.support.clients import RawClient
from tests.support.processes import REPO, BridgeProcess, free_port

SUBACK_FAILURE = 0x80


def test_after_a_node_ran_nothing_under_its_data_dir_is_readable_by_group_or_others(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node = bridge_factory(f"admin_listen=127.0.0.1:{free_port()}")
    node.wait_for_log("admin API")
    keeper = RawClient(node.port)
    assert keeper.connect("keeper", clean_session=False).return_code == 0
    keeper.subscribe("kept/#", 1)
    keeper.sock.close()  # offline: what follows is queued for it
    publisher = RawClient(node.port)
    try:
        assert publisher.connect("publisher").return_code == 0
        publisher.publish("kept/one", b"payload", qos=1, packet_id=1, retain=True)
    finally:
        publisher.sock.close()
    node.stop()  # an orderly stop writes the snapshot and offsets
    written = list(node.data_dir.rglob("*"))
    assert any(path.is_file() for path in written), written
    for path in [node.data_dir, *written]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} has mode {mode:o}"


@pytest.fixture
def with_users(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> Callable[..., BridgeProcess]:
    passwd = tmp_path / "passwd"
    passwd.write_text(
        "".join(f"{u}:{hash_password(u + '-pw', n=2**10)}\n" for u in ("alice", "ops"))
    )
    passwd.chmod(0o600)

    def start(*settings: str) -> BridgeProcess:
        return bridge_factory(f"password_file={passwd}", *settings)

    return start


def login(port: int, user: str) -> RawClient:
    client = RawClient(port)
    client.send(Connect(f"{user}-client", username=user, password=f"{user}-pw".encode()))
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    return client


def test_with_users_and_no_acl_nobody_subscribes_to_client_events(with_users) -> None:
    node = with_users()
    client = login(node.port, "alice")
    try:
        assert client.subscribe("$SYS/#", 0) == [SUBACK_FAILURE]
        assert client.subscribe("$SYS/brokers/+/clients/+/connected", 0, 2) == [SUBACK_FAILURE]
        assert client.subscribe("factory/#", 1, 3) == [1]
        # Statistics stay readable (last: their retained messages follow the SUBACK).
        assert client.subscribe("$SYS/brokers/+/uptime", 0, 4) == [0]
    finally:
        client.sock.close()


def test_with_users_an_acl_rule_naming_sys_lets_one_user_read_client_events(
    with_users, tmp_path: Path
) -> None:
    acl = tmp_path / "acl.conf"
    acl.write_text("allow user:ops subscribe $SYS/#\nallow all all #\n")
    node = with_users(f"acl_file={acl}")
    ops, alice = login(node.port, "ops"), login(node.port, "alice")
    try:
        assert ops.subscribe("$SYS/brokers/+/clients/+/+", 1) == [1]
        assert alice.subscribe("$SYS/brokers/+/clients/+/+", 1) == [SUBACK_FAILURE]
    finally:
        ops.sock.close()
        alice.sock.close()


def test_without_users_a_loopback_node_keeps_client_events_open(bridge) -> None:
    client = RawClient(bridge.port)
    try:
        assert client.connect("watcher").return_code == 0
        assert client.subscribe("$SYS/brokers/+/clients/+/+", 1) == [1]
    finally:
        client.sock.close()


def test_a_public_listener_without_users_exits_2_naming_the_setting_and_no_traceback(
    tmp_path: Path,
) -> None:
    args = [sys.executable, "-m", "bridge", "--listen", f"0.0.0.0:{free_port()}"]
    args += ["--data-dir", str(tmp_path / "data")]
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "configuration error: listen: 0.0.0.0:" in line
    assert "allow_anonymous_public=true" in line


def test_a_node_without_users_says_it_listens_on_loopback_only(bridge) -> None:
    bridge.wait_for_log("client listeners on loopback only")
