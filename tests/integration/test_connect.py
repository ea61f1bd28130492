"""CONNECT handling against a real bridge process: return codes, ClientId rules, takeover,
keepalive and bad input. Spec statement ids are MQTT 3.1.1's."""

from __future__ import annotations

import socket
import time

import pytest

from bridge.mqtt import codec
from bridge.mqtt.packets import (
    Connack,
    ConnackCode,
    Connect,
    Pingreq,
    Pingresp,
    Publish,
    Subscribe,
    Subscription,
)
from tests.support.clients import RawClient, paho_client

pytestmark = pytest.mark.integration


def test_connect_is_accepted_with_return_code_0_MQTT_3_2_2_1(bridge):
    client = RawClient(bridge.port)
    connack = client.connect("dev-1")
    assert connack.return_code == ConnackCode.ACCEPTED
    assert connack.session_present is False
    client.disconnect()


def test_paho_client_connects_and_pings(bridge):
    with paho_client(bridge.port) as client:
        assert client.connack_rc[0] == 0
    raw = RawClient(bridge.port)
    raw.connect("pinger")
    raw.send(Pingreq())
    assert isinstance(raw.recv(), Pingresp)
    raw.disconnect()


def test_unsupported_protocol_level_gets_return_code_1_then_close_MQTT_3_1_2_2(bridge):
    client = RawClient(bridge.port)
    client.send(Connect("old-or-new", protocol_level=6))
    connack = client.recv()
    assert isinstance(connack, Connack)
    assert connack.return_code == ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION
    client.expect_closed()
    bridge.wait_for_log("protocol level 6 not supported")


def test_empty_client_id_with_persistent_session_gets_return_code_2_MQTT_3_1_3_8(bridge):
    client = RawClient(bridge.port)
    client.send(Connect("", clean_session=False))
    connack = client.recv()
    assert connack.return_code == ConnackCode.IDENTIFIER_REJECTED
    client.expect_closed()


def test_empty_client_id_with_clean_session_is_assigned_an_id_MQTT_3_1_3_6(bridge):
    first, second = RawClient(bridge.port), RawClient(bridge.port)
    assert first.connect("").return_code == 0
    assert second.connect("").return_code == 0
    # Two anonymous clients do not take each other over: both still answer pings.
    for client in (first, second):
        client.send(Pingreq())
        assert isinstance(client.recv(), Pingresp)
        client.disconnect()


def test_empty_client_id_refused_when_configured(bridge_factory):
    node = bridge_factory("allow_zero_length_clientid=false")
    client = RawClient(node.port)
    client.send(Connect("", clean_session=True))
    assert client.recv().return_code == ConnackCode.IDENTIFIER_REJECTED


def test_connection_limit_gets_return_code_3_server_unavailable(bridge_factory):
    node = bridge_factory("max_connections=1")
    first = RawClient(node.port)
    assert first.connect("one").return_code == 0
    second = RawClient(node.port)
    second.send(Connect("two"))
    assert second.recv().return_code == ConnackCode.SERVER_UNAVAILABLE
    second.expect_closed()
    first.disconnect()


def test_first_packet_other_than_connect_closes_connection_MQTT_3_1_0_1(bridge):
    client = RawClient(bridge.port)
    client.send(Subscribe(1, [Subscription("a", 0)]))
    client.expect_closed()
    bridge.wait_for_log("not CONNECT (MQTT-3.1.0-1)")


def test_second_connect_is_a_protocol_violation_and_closes_MQTT_3_1_0_2(bridge):
    client = RawClient(bridge.port)
    client.connect("twice")
    client.send(Connect("twice"))
    client.expect_closed()
    bridge.wait_for_log("second CONNECT")


def test_connect_with_reserved_flag_closes_without_connack_MQTT_3_1_2_3(bridge):
    data = bytearray(codec.encode(Connect("flags")))
    data[9] |= 0x01  # connect flags byte: reserved bit
    client = RawClient(bridge.port)
    client.send_bytes(bytes(data))
    client.expect_closed()
    bridge.wait_for_log("MQTT-3.1.2-3")


def test_malformed_remaining_length_closes_and_node_keeps_serving_others(bridge):
    healthy = RawClient(bridge.port)
    healthy.connect("healthy")
    bad = RawClient(bridge.port)
    bad.send_bytes(b"\x10\xff\xff\xff\xff\x01")
    bad.expect_closed()
    healthy.send(Pingreq())
    assert isinstance(healthy.recv(), Pingresp)
    healthy.disconnect()


def test_garbage_bytes_are_answered_with_a_close_and_a_log_line(bridge):
    client = RawClient(bridge.port)
    client.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    client.expect_closed()
    bridge.wait_for_log("protocol violation")


def test_no_connect_within_connect_timeout_closes(bridge_factory):
    node = bridge_factory("connect_timeout=0.5")
    sock = socket.create_connection(("127.0.0.1", node.port))
    sock.settimeout(5)
    assert sock.recv(10) == b""
    node.wait_for_log("no CONNECT within connect_timeout")
    sock.close()


def test_keepalive_timeout_closes_after_one_and_a_half_periods_MQTT_3_1_2_24(bridge):
    client = RawClient(bridge.port, timeout=6)
    client.connect("sleepy", keepalive=1)
    started = time.monotonic()
    client.expect_closed(timeout=6)
    elapsed = time.monotonic() - started
    assert 1.2 <= elapsed < 10.0  # not before 1.5 x keepalive (less scheduling slack), not never
    bridge.wait_for_log("keepalive timeout")


def test_pings_keep_a_connection_alive_past_its_keepalive(bridge):
    client = RawClient(bridge.port)
    client.connect("pinging", keepalive=1)
    for _ in range(4):
        time.sleep(0.5)
        client.send(Pingreq())
        assert isinstance(client.recv(), Pingresp)
    client.disconnect()


def test_new_connection_with_same_client_id_takes_over_and_closes_old_MQTT_3_1_4_2(bridge):
    old = RawClient(bridge.port)
    old.connect("taken")
    new = RawClient(bridge.port)
    assert new.connect("taken").return_code == 0
    old.expect_closed()
    new.send(Pingreq())
    assert isinstance(new.recv(), Pingresp)
    new.disconnect()


def test_oversized_packet_closes_connection_with_log(bridge_factory):
    node = bridge_factory("max_packet_size=1024")
    client = RawClient(node.port)
    client.connect("big")
    client.send(Publish("t", b"x" * 2000, 0))
    client.expect_closed()
    node.wait_for_log("exceeds max_packet_size=1024")


def test_publish_to_wildcard_topic_closes_connection_MQTT_3_3_2_2(bridge):
    client = RawClient(bridge.port)
    client.connect("wild")
    # encode by hand: our codec refuses to build an invalid PUBLISH
    topic = b"a/+"
    body = len(topic).to_bytes(2, "big") + topic + b"x"
    client.send_bytes(bytes([0x30, len(body)]) + body)
    client.expect_closed()
    bridge.wait_for_log("MQTT-3.3.2-2")


def test_invalid_utf8_in_topic_closes_connection_MQTT_1_5_3_1(bridge):
    client = RawClient(bridge.port)
    client.connect("utf")
    topic = b"a/\xed\xa0\x80"  # an encoded surrogate: ill-formed UTF-8
    body = len(topic).to_bytes(2, "big") + topic
    client.send_bytes(bytes([0x30, len(body)]) + body)
    client.expect_closed()
    bridge.wait_for_log("MQTT-1.5.3-1")


def test_null_character_in_topic_closes_connection_MQTT_1_5_3_2(bridge):
    client = RawClient(bridge.port)
    client.connect("nul")
    topic = b"a/\x00b"
    body = len(topic).to_bytes(2, "big") + topic
    client.send_bytes(bytes([0x30, len(body)]) + body)
    client.expect_closed()
    bridge.wait_for_log("MQTT-1.5.3-2")


def test_topic_longer_than_limit_closes_connection(bridge_factory):
    node = bridge_factory("max_topic_length=16")
    client = RawClient(node.port)
    client.connect("long")
    client.send(Publish("a" * 17, b"x", 0))
    client.expect_closed()
    node.wait_for_log("max_topic_length=16")


@pytest.fixture
def password_file(tmp_path):
    from bridge.access.hashes import hash_password

    path = tmp_path / "passwords"
    path.write_text(f"device-7:{hash_password('s3cret', n=2**10)}\n")
    path.chmod(0o600)
    return path


def connect_with(port: int, username: str | None, password: bytes | None) -> Connack:
    client = RawClient(port)
    client.send(Connect("auth-test", username=username, password=password))
    connack = client.recv()
    assert isinstance(connack, Connack)
    return connack


def test_password_file_accepts_the_right_password(bridge_factory, password_file):
    node = bridge_factory(f"password_file={password_file}")
    assert connect_with(node.port, "device-7", b"s3cret").return_code == ConnackCode.ACCEPTED


def test_wrong_password_gets_return_code_4_bad_user_name_or_password(bridge_factory, password_file):
    # Every refusal logged: the line about the second one is what this test reads.
    node = bridge_factory(f"password_file={password_file}", "refused_connect_log_interval=0")
    connack = connect_with(node.port, "device-7", b"guess")
    assert connack.return_code == ConnackCode.BAD_USERNAME_OR_PASSWORD
    assert connect_with(node.port, "nobody", b"s3cret").return_code == 4
    node.wait_for_log("authentication failed (BAD_CREDENTIALS) for user 'nobody'")
    assert "s3cret" not in node.log_text()


def test_client_without_credentials_gets_return_code_5_when_anonymous_is_off(
    bridge_factory, password_file
):
    node = bridge_factory(f"password_file={password_file}", "allow_anonymous=false")
    connack = connect_with(node.port, None, None)
    assert connack.return_code == ConnackCode.NOT_AUTHORIZED


def test_sighup_reloads_the_password_file(bridge_factory, password_file):
    import os
    import signal

    from bridge.access.hashes import hash_password

    node = bridge_factory(f"password_file={password_file}")
    assert connect_with(node.port, "device-8", b"new").return_code == 4
    with password_file.open("a") as fh:
        fh.write(f"device-8:{hash_password('new', n=2**10)}\n")
    os.kill(node.pid, signal.SIGHUP)
    node.wait_for_log("reloaded the password and ACL files")
    assert connect_with(node.port, "device-8", b"new").return_code == 0


def test_bad_password_file_is_refused_at_start_with_a_message(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad"
    bad.write_text("no-colon-here\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "--listen",
            "127.0.0.1:0",
            "--set",
            f"password_file={bad}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "configuration error" in result.stderr and f"{bad}:1" in result.stderr
    assert "Traceback" not in result.stderr
