"""What clients send cannot forge or flood the log: client-controlled text is escaped and cut,
refused CONNECTs and connections closed for malformed packets are logged at a bounded pace with
a count."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.passwd import hash_password
from bridge.mqtt.packets import Connect, Disconnect
from bridge.mqtt.properties import PropertyId
from tests.integration.test_listener_guards import admin, wait_metric
from tests.support.admin_http import AdminHttp
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess

EVIL_ID = "evil\nFAKE 2026-01-01 ERROR forged line \x1b[31mred\x1b[0m"


@pytest.fixture
def with_users(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> Callable[..., BridgeProcess]:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    passwd.chmod(0o600)

    def start(*settings: str) -> BridgeProcess:
        return bridge_factory(f"password_file={passwd}", *settings)

    return start


def refuse_once(port: int, client_id: str) -> None:
    """CONNECT without credentials to a node that refuses anonymous clients; wait for CONNACK."""
    client = RawClient(port)
    try:
        client.send(Connect(client_id))
        client.recv()
    finally:
        client.sock.close()


def test_a_clientid_with_a_newline_and_ansi_escapes_makes_one_escaped_log_line(with_users):
    node = with_users()
    refuse_once(node.port, EVIL_ID)
    text = node.wait_for_log("forged line")
    (line,) = [line for line in text.splitlines() if "forged line" in line]
    assert "refused" in line
    assert "evil\\nFAKE" in line and "\\x1b[31mred" in line
    assert "\x1b" not in text
    assert not any(line.startswith("FAKE") for line in text.splitlines())


def test_a_huge_disconnect_reason_string_is_logged_cut_with_its_length(with_users):
    node = with_users()
    client = RawClient5(node.port)
    try:
        assert client.connect("big-reason", username="alice", password=b"alice-pw").return_code == 0
        reason = "x" * 65_000 + "\nFAKE line"  # a string property holds at most 65535 bytes
        client.send(Disconnect(0x80, {PropertyId.REASON_STRING: reason}))
        text = node.wait_for_log("DISCONNECT with reason 0x80")
    finally:
        client.sock.close()
    (line,) = [line for line in text.splitlines() if "DISCONNECT with reason" in line]
    assert len(line) < 1000
    assert f"[+{len(reason) - 128} chars]" in line
    assert "FAKE line" not in text


def test_a_hundred_refused_connects_log_a_bounded_number_of_lines_with_a_count(with_users):
    interval = 1.0
    node = with_users(f"refused_connect_log_interval={interval}", "login_failure_delay=0")
    started = time.monotonic()
    for number in range(100):
        refuse_once(node.port, f"flood-{number}")
    elapsed = time.monotonic() - started
    node.wait_for_log("flood-0")
    lines = [line for line in node.log_text().splitlines() if "refused:" in line]
    assert 1 <= len(lines) <= 2 + elapsed / interval, lines
    # The next line after the interval says how many were not logged.
    deadline = time.monotonic() + 15
    counted = ""
    while not counted and time.monotonic() < deadline:
        refuse_once(node.port, "one-more")
        counted = next(
            (line for line in node.log_text().splitlines() if "more not logged" in line), ""
        )
        time.sleep(0.05)
    assert counted, node.log_text()[-2000:]
    suppressed = int(counted.split("(+")[1].split()[0])
    assert suppressed >= 100 - len(lines)


def malformed_once(port: int, client_id: str | None = None) -> None:
    """A connection that sends a malformed packet (type 15 is reserved), after logging in as
    alice with `client_id` if one is given; wait for the node to close it."""
    client = RawClient(port)
    try:
        if client_id is not None:
            client.send(Connect(client_id, username="alice", password=b"alice-pw"))
            assert client.recv().return_code == 0
        client.send_bytes(b"\xf0\x00")
        client.expect_closed()
    finally:
        client.sock.close()


def test_a_hundred_malformed_connections_log_a_bounded_number_of_lines_with_a_count(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    passwd.chmod(0o600)
    interval = 1.0
    factory = admin(
        bridge_factory, f"password_file={passwd}", f"protocol_fault_log_interval={interval}"
    )
    node = factory()
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    started = time.monotonic()
    for _ in range(100):
        malformed_once(node.port)
    elapsed = time.monotonic() - started
    node.wait_for_log("packet type 15 is reserved")

    def fault_lines() -> list[str]:
        return [line for line in node.log_text().splitlines() if "is reserved" in line]

    assert 1 <= len(fault_lines()) <= 2 + elapsed / interval, fault_lines()
    # Once the interval is over, the next such line is logged: it names the client, escaped,
    # and says how many were not logged.
    tries = 0
    while not any("evil\\nFAKE" in line for line in fault_lines()):
        assert tries < 300, node.log_text()[-2000:]
        tries += 1
        malformed_once(node.port, EVIL_ID)
        time.sleep(0.05)
    lines = fault_lines()
    assert "\x1b" not in node.log_text()
    assert "(+" in lines[-1] and "more not logged" in lines[-1]
    # Every fault is either a line or counted in a later one.
    counted = sum(int(line.split("(+")[1].split()[0]) for line in lines if "(+" in line)
    assert len(lines) + counted == 100 + tries, lines
    wait_metric(api, "protocol_faults_total", 100 + tries)
