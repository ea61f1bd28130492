"""Authentication and ACL on a real bridge process, with raw MQTT clients: allow and deny for
CONNECT (with and without credentials, and the will topic), SUBSCRIBE and PUBLISH at each QoS,
`%c`/`%u` substitution, and rules re-read on SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.hashes import hash_password
from bridge.mqtt.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.clients import RawClient
from tests.support.processes import REPO, BridgeProcess, free_port

pytestmark = pytest.mark.integration

ACL = """\
# admin sees everything; devices publish their own telemetry and read their own commands
allow user:admin  all        #
deny  all         subscribe  secret/#
allow all         publish    devices/%c/telemetry
allow all         subscribe  devices/%c/cmd
allow all         all        users/%u/#
allow all         publish    wills/%c
allow anonymous   subscribe  public/#
"""

USERS = {"admin": "admin-pw", "alice": "alice-pw", "dev1": "dev1-pw"}


@pytest.fixture
def secured(tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    passwd = tmp_path / "passwd"
    passwd.write_text("".join(f"{u}:{hash_password(p, n=2**10)}\n" for u, p in USERS.items()))
    passwd.chmod(0o600)
    acl = tmp_path / "acl.conf"
    acl.write_text(ACL)
    # Anonymous clients are part of the ACL under test ("allow anonymous" rules).
    return bridge_factory(f"password_file={passwd}", f"acl_file={acl}", "allow_anonymous=true")


def connect(
    port: int,
    client_id: str,
    username: str | None = None,
    password: str | None = None,
    will: Will | None = None,
) -> tuple[RawClient, Connack]:
    client = RawClient(port)
    client.send(
        Connect(
            client_id,
            username=username,
            password=password.encode() if password is not None else None,
            will=will,
        )
    )
    connack = client.recv()
    assert isinstance(connack, Connack), connack
    return client, connack


def login(port: int, client_id: str, username: str | None = None) -> RawClient:
    client, connack = connect(
        port, client_id, username, USERS[username] if username is not None else None
    )
    assert connack.return_code == 0, connack
    return client


def expect_nothing(client: RawClient, wait: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        client.recv(timeout=wait)


def test_connect_without_credentials_is_refused_with_5_when_anonymous_is_not_allowed(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    passwd.chmod(0o600)
    node = bridge_factory(
        f"password_file={passwd}", "allow_anonymous=false", "refused_connect_log_interval=0"
    )
    never_sent, connack = connect(node.port, "no-credentials")
    assert connack.return_code == 5
    never_sent.expect_closed()
    _wrong, connack = connect(node.port, "wrong", "alice", "not-it")
    assert connack.return_code == 4
    _unknown, connack = connect(node.port, "unknown", "mallory", "x")
    assert connack.return_code == 4
    right, connack = connect(node.port, "right", "alice", "alice-pw")
    assert connack.return_code == 0
    right.disconnect()
    log = node.log_text()
    assert "authentication failed (NOT_AUTHORIZED) for user None" in log
    assert "authentication failed (BAD_CREDENTIALS) for user 'mallory'" in log


def test_auth_off_by_default_says_so_loudly_in_the_log(bridge: BridgeProcess) -> None:
    log = bridge.log_text()
    assert "WARNING" in log and "authentication OFF" in log and "ACL off" in log


def test_subscribe_denied_filters_get_0x80_and_allowed_ones_in_the_same_packet_are_granted(
    secured: BridgeProcess,
) -> None:
    dev = login(secured.port, "dev1", "dev1")
    dev.send(
        Subscribe(
            1,
            [
                Subscription("devices/dev1/cmd", 1),  # its own: allowed
                Subscription("devices/dev2/cmd", 1),  # another device's: no rule
                Subscription("devices/+/cmd", 1),  # wider than its own: not covered
                Subscription("secret/#", 0),  # denied outright
                Subscription("#", 0),  # overlaps secret/#: denied
                Subscription("users/dev1/inbox", 2),  # %u rule
            ],
        )
    )
    suback = dev.recv()
    assert list(suback.return_codes) == [1, SUBACK_FAILURE, SUBACK_FAILURE, SUBACK_FAILURE,
                                         SUBACK_FAILURE, 2]  # fmt: skip
    admin = login(secured.port, "ops", "admin")
    assert admin.subscribe("secret/#", 1) == [1]
    assert admin.subscribe("$share/g/devices/+/cmd", 1) == [1]
    anonymous = login(secured.port, "anon")
    assert anonymous.subscribe("public/news", 0) == [0]
    assert anonymous.subscribe("users/x/#", 0) == [SUBACK_FAILURE]  # no user name for %u
    log = secured.log_text()
    assert "SUBSCRIBE 'devices/dev2/cmd' refused (0x80): denied by the ACL" in log


def test_publish_denied_by_the_acl_is_acknowledged_dropped_and_logged_at_every_qos(
    secured: BridgeProcess,
) -> None:
    watcher = login(secured.port, "watcher", "admin")
    assert watcher.subscribe("#", 2) == [2]
    dev = login(secured.port, "dev1", "dev1")
    # Allowed: its own telemetry topic, at each QoS.
    dev.publish("devices/dev1/telemetry", b"ok0", 0)
    dev.publish("devices/dev1/telemetry", b"ok1", 1, packet_id=1)
    dev.publish("devices/dev1/telemetry", b"ok2", 2, packet_id=2)
    # Denied: another device's topic. 3.1.1 cannot refuse a PUBLISH: it is acknowledged, the
    # QoS 2 handshake completes, and the message goes nowhere.
    dev.send(Publish("devices/dev2/telemetry", b"no0", 0))
    dev.send(Publish("devices/dev2/telemetry", b"no1", 1, packet_id=3))
    assert dev.recv() == Puback(3)
    dev.send(Publish("devices/dev2/telemetry", b"no2", 2, packet_id=4))
    assert dev.recv() == Pubrec(4)
    dev.send(Pubrel(4))
    assert dev.recv() == Pubcomp(4)
    received = []
    deadline = time.monotonic() + 5
    while len(received) < 3 and time.monotonic() < deadline:
        packet = watcher.recv()
        if isinstance(packet, Publish):
            received.append(packet.payload)
            if packet.qos == 1:
                watcher.send(Puback(packet.packet_id))
            elif packet.qos == 2:
                watcher.send(Pubrec(packet.packet_id))
        elif isinstance(packet, Pubrel):
            watcher.send(Pubcomp(packet.packet_id))
    assert sorted(received) == [b"ok0", b"ok1", b"ok2"]
    deadline = time.monotonic() + 0.7
    while time.monotonic() < deadline:  # nothing denied arrives
        try:
            packet = watcher.recv(timeout=0.2)
        except TimeoutError:
            continue
        assert not (isinstance(packet, Publish) and packet.payload.startswith(b"no")), packet
        if isinstance(packet, Pubrel):
            watcher.send(Pubcomp(packet.packet_id))
    log = secured.wait_for_log("PUBLISH to 'devices/dev2/telemetry' dropped: denied by the ACL")
    # The first denial of a topic is a warning, the repeats are not (a flood stays readable).
    warning = "WARNING bridge.connection: client dev1 (user 'dev1'): PUBLISH to 'devices/dev2/"
    assert log.count(warning) == 1
    assert log.count("PUBLISH to 'devices/dev2/telemetry' dropped") == 3


def test_a_will_on_a_topic_the_acl_denies_refuses_the_connect_with_5(
    secured: BridgeProcess,
) -> None:
    denied, connack = connect(
        secured.port, "dev1", "dev1", "dev1-pw", will=Will("devices/other/status", b"x", 0, False)
    )
    assert connack.return_code == 5
    denied.expect_closed()
    _allowed, connack = connect(
        secured.port, "dev1", "dev1", "dev1-pw", will=Will("wills/dev1", b"gone", 1, False)
    )
    assert connack.return_code == 0
    assert "ACL denies publishing the will topic 'devices/other/status'" in secured.log_text()


def test_sighup_rereads_the_acl_file_and_no_cached_decision_survives_it(
    tmp_path: Path, secured: BridgeProcess
) -> None:
    dev = login(secured.port, "dev1", "dev1")
    assert dev.subscribe("announcements", 0) == [SUBACK_FAILURE]
    (tmp_path / "acl.conf").write_text(ACL + "allow all subscribe announcements\n")
    assert secured.proc is not None
    os.kill(secured.proc.pid, signal.SIGHUP)
    secured.wait_for_log("reloaded the password and ACL files")
    assert dev.subscribe("announcements", 0, packet_id=2) == [0]
    # A malformed file keeps the rules in force, and says why.
    (tmp_path / "acl.conf").write_text("allow everybody publish x\n")
    os.kill(secured.proc.pid, signal.SIGHUP)
    secured.wait_for_log("ACL file not reloaded, the previous rules stay")
    assert dev.subscribe("announcements", 0, packet_id=3) == [0]


def test_a_bad_acl_file_stops_the_start_with_a_message_naming_the_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl.conf"
    acl.write_text("# fine\nallow all publish a/#/b\n")
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
         str(tmp_path / "data"), "--set", f"acl_file={acl}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "configuration error" in line and f"{acl}:2: filter 'a/#/b'" in line
