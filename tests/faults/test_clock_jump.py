"""A node's wall clock jumping an hour forward and an hour back (libfaketime, its offset read
from a file the test rewrites; the monotonic clock is left alone, as a real clock step leaves
it). An offline session ages by the time that really passed: the jump forward expires nothing
early (the session and what was published to it meanwhile are there when its client returns),
and the jump back keeps nothing past its expiry.

What still reads the wall clock, by design, is said in docs/design.md ("When a clock jumps"):
the absolute times that other nodes and restarts must agree on (bans, message expiry, delayed
publish, session ages across a restart)."""

from __future__ import annotations

import datetime
import os
import re
import time
from pathlib import Path

import pytest

from bridge.mqtt.packets import Subscription
from bridge.mqtt.properties import PropertyId
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.fault, pytest.mark.timeout(60)]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
HOUR = 3600


def set_offset(clock: Path, seconds: int) -> None:
    """The faked process's wall clock runs `seconds` off from now on (its next reading)."""
    tmp = clock.with_suffix(".tmp")
    tmp.write_text(f"{seconds:+d}\n")
    os.replace(tmp, clock)


def node_clock_offset(node: BridgeProcess, client_id: str) -> float:
    """Seconds the node's wall clock is ahead, read from the time it logged `client_id`'s
    connect at (its log's time stamps are its wall clock's)."""
    line = node.wait_for_log(f"client {client_id} connected").splitlines()
    stamp = next(x for x in reversed(line) if f"client {client_id} connected" in x)
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", stamp)
    assert match, stamp
    logged = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return logged.timestamp() - time.time()


def session(node: BridgeProcess, client_id: str, expiry: int) -> tuple[RawClient5, bool]:
    client = RawClient5(node.port)
    connack = client.connect(
        client_id, False, properties={PropertyId.SESSION_EXPIRY_INTERVAL: expiry}
    )
    assert connack.return_code == 0
    return client, bool(connack.session_present)


@pytest.fixture
def clock(tmp_path: Path) -> Path:
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} missing: make test-deps installs Debian's faketime")
    clock = tmp_path / "clock"
    set_offset(clock, 0)
    return clock


def test_a_wall_clock_jump_neither_expires_an_offline_session_early_nor_keeps_it_late(
    tmp_path: Path, clock: Path
) -> None:
    faked = [
        "env",
        f"LD_PRELOAD={LIBFAKETIME}",
        f"FAKETIME_TIMESTAMP_FILE={clock}",
        "FAKETIME_NO_CACHE=1",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
    ]
    node = BridgeProcess(tmp_path / "data", wrap=faked).start()
    try:
        away, _ = session(node, "away", expiry=600)
        assert away.subscribe_many(Subscription("clock/#", 1)) == [1]
        away.disconnect()
        brief, _ = session(node, "brief", expiry=2)
        assert brief.subscribe_many(Subscription("clock/#", 1)) == [1]
        brief.disconnect()

        set_offset(clock, HOUR)
        publisher, _ = session(node, "jumped-ahead", expiry=0)
        offset = node_clock_offset(node, "jumped-ahead")
        assert abs(offset - HOUR) < 60, f"the node's clock is {offset:.0f} s ahead, not an hour"
        publisher.publish("clock/x", b"while away", 1, packet_id=1)
        publisher.disconnect()
        away, present = session(node, "away", expiry=600)
        assert present, "an hour's jump forward expired a session offline for seconds"
        assert away.recv_publish(5).payload == b"while away"
        away.disconnect()

        set_offset(clock, -HOUR)
        time.sleep(3.0)  # past "brief"'s 2 s, really; an hour less by the node's clock
        brief, present = session(node, "brief", expiry=2)
        offset = node_clock_offset(node, "brief")
        assert abs(offset + HOUR) < 60, f"the node's clock is {offset:.0f} s off, not -1 h"
        assert not present, "a session was kept past its expiry by a jump back"
        brief.disconnect()
    finally:
        node.kill()
