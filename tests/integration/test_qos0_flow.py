"""A QoS 0 publisher goes at the pace of its subscribers (`bridge.node.qos0_flow`): a subscriber
that reads slowly gets every message, one that does not read at all holds its publisher only for
`qos0_publisher_wait`, and a publisher we stop reading is never taken for a silent one."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest

from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Pingreq, Pingresp, Publish
from tests.integration.test_limits import counter, limited_node
from tests.support.clients import RawClient
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

PAYLOAD = 1000
"""Bytes per message: 10,000 of them are 10 MB, ten times `write_buffer_high` below."""


def flood(port: int, client_id: str, topic: str, count: int) -> threading.Thread:
    """A publisher that sends `count` QoS 0 messages as fast as its socket takes them (its
    `sendall` blocks while the bridge does not read it), numbered in their payloads."""
    pub = RawClient(port, timeout=60)
    pub.connect(client_id)
    data = b"".join(
        codec.encode(Publish(topic, b"%08d" % i + b"x" * (PAYLOAD - 8), 0)) for i in range(count)
    )

    def run() -> None:
        pub.sock.sendall(data)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read_numbers(
    client: RawClient, count: int, chunk: int, pause: float, limit: float
) -> list[int]:
    """The numbers of the PUBLISH packets `client` gets, reading `chunk` bytes every `pause`
    seconds, until `count` came or nothing came for 3 s (at most `limit` seconds)."""
    sock = client.sock
    decoder = Decoder()
    numbers: list[int] = []
    deadline = time.monotonic() + limit
    quiet_since = time.monotonic()
    while len(numbers) < count and time.monotonic() < deadline:
        sock.settimeout(0.5)
        try:
            data = sock.recv(chunk)
        except TimeoutError:
            if time.monotonic() - quiet_since > 3.0:
                break
            continue
        if not data:
            break
        quiet_since = time.monotonic()
        decoder.feed(data)
        numbers.extend(int(p.payload[:8]) for p in decoder.packets() if isinstance(p, Publish))
        if pause:
            time.sleep(pause)
    return numbers


def assert_all_sent_and_read(publisher: threading.Thread, numbers: list[int], count: int) -> None:
    """The publisher's socket took all `count` messages, and the subscriber read them all, in
    order (`numbers`)."""
    publisher.join(10)
    assert not publisher.is_alive(), "the publisher's socket never took all of its messages"
    assert numbers == list(range(count)), (
        f"{len(numbers)} of {count} delivered ({len(set(range(count)) - set(numbers))} missing)"
    )


def subscriber(port: int, client_id: str, topic: str) -> RawClient:
    """A raw client subscribed to `topic` at QoS 0, reading nothing until told to."""
    client = RawClient(port)
    client.connect(client_id)
    client.subscribe(topic, 0)
    return client


def slow_socket(client: RawClient) -> None:
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)


def test_a_qos0_flood_to_a_slow_reader_waits_for_it_and_loses_nothing(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    # 10 MB at full speed into a subscriber reading ~3 MB/s: without the wait, its buffer passes
    # write_buffer_high (1 MiB) within a second and QoS 0 messages to it drop.
    node, api = limited_node(bridge_factory, "write_buffer_high=1048576")
    sub = subscriber(node.port, "slow-reader", "flood/slow")
    count = 10_000
    publisher = flood(node.port, "fast-writer", "flood/slow", count)
    numbers = read_numbers(sub, count, chunk=32768, pause=0.01, limit=60)
    assert_all_sent_and_read(publisher, numbers, count)
    assert counter(api, "qos0_publisher_waits_total") >= 1
    assert "dropping QoS 0" not in node.log_text()


def test_a_subscriber_that_stops_reading_holds_its_publisher_only_for_the_wait(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = limited_node(bridge_factory, "write_buffer_high=1048576", "qos0_publisher_wait=0.5")
    stuck = subscriber(node.port, "stuck", "flood/all")
    slow_socket(stuck)
    healthy = subscriber(node.port, "healthy", "flood/all")
    count = 10_000
    publisher = flood(node.port, "flooder", "flood/all", count)
    numbers = read_numbers(healthy, count, chunk=65536, pause=0.0, limit=60)
    assert_all_sent_and_read(publisher, numbers, count)
    node.wait_for_log("client stuck (")
    assert "publishers no longer wait for it" in node.log_text()
    assert counter(api, "qos0_subscribers_stuck_total") >= 1
    node.wait_for_log("dropping QoS 0 messages to it")  # past write_buffer_high, as before
    assert "client flooder (" not in node.log_text(), "the publisher was disconnected"


def test_a_publisher_held_for_a_subscriber_is_not_taken_for_silent(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    # Keepalive 1 s (cut after 1.5 s of silence); the bridge does not read the publisher for
    # 3 s while a subscriber it feeds does not read. Not read is not silent: it stays connected.
    node = bridge_factory("write_buffer_high=4194304", "qos0_publisher_wait=3")
    stuck = subscriber(node.port, "stuck", "flood/held")
    slow_socket(stuck)
    pub = RawClient(node.port, timeout=10)
    pub.connect("held-publisher", keepalive=1)
    data = codec.encode(Publish("flood/held", b"x" * PAYLOAD, 0)) * 20_000
    sender = threading.Thread(target=pub.sock.sendall, args=(data,), daemon=True)
    sender.start()
    node.wait_for_log("publishers no longer wait for it", timeout=20)
    sender.join(20)
    assert not sender.is_alive(), "the publisher was never read again"
    pub.send(Pingreq())
    assert isinstance(pub.recv(5), Pingresp)
    assert "keepalive timeout" not in node.log_text()
