"""kill -9 of a bridge on the embedded store with delayed publishes pending: after the restart
every one is delivered once (QoS 2 never twice, QoS 1 not repeated either: the delivery and the
removal from the index are one append), those delivered before the kill are not delivered
again, and retention, run meanwhile on a log many times its limit, kept the segments the
pending ones wait in."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.clients import RawClient
from tests.support.processes import BridgeProcess
from tests.support.qos import ExactlyOnceReceiver

pytestmark = pytest.mark.fault

SMALL_LOG = ("segment_bytes=65536", "segment_preallocate_bytes=0", "retention_bytes=131072")
"""Segments of 64 KiB, 128 KiB kept: the filler below is ten times that."""
KiB = 1024


def fill(client: RawClient, count: int, first_id: int) -> None:
    """QoS 1 messages of 4 KiB no one subscribes to: log bytes for retention to delete."""
    for i in range(count):
        client.publish("filler/t", b"f" * 4 * KiB, qos=1, packet_id=first_id + i)


def fill_until_retention_ran(client: RawClient, node: BridgeProcess) -> None:
    """Fill (retention looks after commits, at most once a second) until it deleted segments."""
    deadline = time.monotonic() + 30
    chunk = 0
    while "retention deleted" not in node.log_text():
        assert time.monotonic() < deadline, "retention never ran: " + node.log_text()[-2000:]
        fill(client, 50, 2000 + 50 * (chunk % 1000))
        chunk += 1


def test_delayed_publishes_pending_at_a_kill_9_are_delivered_once_after_the_restart(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    node = bridge_factory(*SMALL_LOG, data_dir=tmp_path / "node")
    subscriber = ExactlyOnceReceiver(node.port, "delayed-sub")
    assert subscriber.connect().subscribe("plant/#", 2) == [2]
    assert subscriber.client is not None
    subscriber.client.disconnect()  # offline: its queue keeps what falls due

    publisher = RawClient(node.port)
    assert publisher.connect("delayed-pub").return_code == 0
    fill(publisher, 100, 1000)
    early = [(f"early-q{1 + i % 2}-{i}", 1 + i % 2) for i in range(20)]
    late = [(f"late-q{1 + i % 2}-{i}", 1 + i % 2) for i in range(40)]
    for i, (payload, qos) in enumerate(early):
        publisher.publish("$delayed/1/plant/early", payload.encode(), qos, packet_id=1 + i)
    for i, (payload, qos) in enumerate(late):
        body = payload.encode() + b"|" + b"p" * 2 * KiB
        publisher.publish("$delayed/8/plant/late", body, qos, packet_id=100 + i)
    published = time.monotonic()
    fill_until_retention_ran(publisher, node)
    time.sleep(max(0.0, published + 1.5 - time.monotonic()))  # the early ones fall due
    node.kill()  # SIGKILL by PID

    restarted = bridge_factory(*SMALL_LOG, data_dir=tmp_path / "node", port=node.port)
    restarted.wait_for_log("delayed publishes pending")
    subscriber.connect()
    subscriber.receive(until=len(early), timeout=10)
    subscriber.receive(until=len(early) + len(late), timeout=20)
    subscriber.receive(until=len(early) + len(late) + 1, timeout=1.5)  # any stray repeat
    assert subscriber.client is not None
    subscriber.client.disconnect()
    delivered = {payload.split("|")[0]: n for payload, n in subscriber.delivered.items()}
    assert delivered == {payload: 1 for payload, _ in early + late}
