"""The factory simulator (`python -m spark.simulate`) against a real bridge: what a subscriber to
`factory/#` receives is exactly what the simulator says it sent, every payload follows
docs/telemetry.md, and failures are reported in one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Connack, Connect, Puback, Publish
from spark.simulate import Options, Summary, run
from spark.telemetry import telemetry_topic, validate
from tests.support.clients import PahoClient, paho_client
from tests.support.processes import REPO, BridgeProcess, free_port
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration


def subscribe_all(client: PahoClient, topic_filter: str = "factory/#") -> None:
    """Subscribe at QoS 1 and wait for the SUBACK, so nothing published afterwards is missed."""
    subscribed = threading.Event()
    client.client.on_subscribe = lambda *_args: subscribed.set()
    client.client.subscribe(topic_filter, qos=1)
    assert subscribed.wait(5), "no SUBACK"


def receive(client: PahoClient, expected: int, timeout: float = 20.0) -> list[Any]:
    """Messages until `expected` distinct (topic, payload) pairs arrived, then anything that
    follows within half a second (there should be nothing)."""
    messages = client.drain(expected, timeout)
    seen = {(m.topic, m.payload) for m in messages}
    while len(seen) < expected:
        more = client.drain(1, 1.0)
        if not more:
            break
        messages += more
        seen |= {(m.topic, m.payload) for m in more}
    return messages + client.drain(10_000, 0.5)


def simulate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark.simulate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_every_simulated_message_arrives_once_valid_and_in_sequence(
    bridge: BridgeProcess,
) -> None:
    with paho_client(bridge.port) as subscriber:
        subscribe_all(subscriber)
        proc = simulate(
            *("--port", str(bridge.port), "--lines", "2", "--devices-per-line", "3"),
            *("--count", "200", "--rate", "400", "--duration", "30"),
        )
        assert proc.returncode == 0, proc.stderr
        messages = receive(subscriber, 200)

    records: dict[tuple[str, int], dict[str, Any]] = {}
    for message in messages:
        record, reason = validate(message.payload)
        assert reason is None, (reason, message.payload)
        assert record is not None
        assert message.topic == telemetry_topic(record["line"], record["device"])
        records.setdefault((record["device"], record["seq"]), record)
    assert len(records) == 200

    seqs: dict[str, list[int]] = defaultdict(list)
    for device, seq in records:
        seqs[device].append(seq)
    assert sorted(seqs) == [f"L{line}-D0{n}" for line in (1, 2) for n in (1, 2, 3)]
    for device, numbers in seqs.items():
        assert sorted(numbers) == list(range(len(numbers))), f"{device} has gaps: {numbers}"

    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.startswith("simulate: done in "), proc.stderr
    assert "sent 200 (0 malformed" in summary and "acked 200," in summary, summary
    assert "Traceback" not in proc.stderr


def test_an_unreachable_broker_is_one_line_and_a_failure() -> None:
    port = free_port()
    started = time.monotonic()
    proc = simulate("--port", str(port), "--count", "10", timeout=30)
    assert proc.returncode != 0
    assert (
        proc.stderr.strip() == f"simulate: cannot connect to 127.0.0.1:{port}: Connection refused"
    )
    assert proc.stdout == ""
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "-5"],
        ["--rate", "0"],
        ["--count", "0"],
        ["--duration", "-1"],
        ["--malformed", "1.5"],
        ["--qos", "2"],
        ["--lines", "many"],
        ["--start-ms", "5"],
    ],
)
def test_bad_options_are_usage_errors(args: list[str]) -> None:
    proc = simulate(*args, timeout=30)
    assert proc.returncode == 2
    assert "error: argument" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_payloads_are_sent_and_counted(bridge: BridgeProcess) -> None:
    options = Options(
        port=bridge.port,
        lines=2,
        devices_per_line=3,
        count=200,
        rate=400,
        duration=30,
        malformed=0.1,
        seed=11,
    )
    with paho_client(bridge.port) as subscriber:
        subscribe_all(subscriber)
        summary = asyncio.run(run(options))
        messages = receive(subscriber, 200)

    assert (summary.sent, summary.acked, summary.undelivered) == (200, 200, 0)
    distinct = {(m.topic, m.payload) for m in messages}
    assert len(distinct) == 200
    rejected = [payload for _, payload in distinct if validate(payload)[0] is None]
    assert 0 < len(rejected) == summary.malformed
    assert 5 <= summary.malformed <= 40  # about 10% of 200
    assert len({validate(payload)[1] for payload in rejected}) >= 3


def test_devices_reconnect_and_resend_after_their_connections_drop(bridge: BridgeProcess) -> None:
    """Cut every connection mid-run: the devices reconnect with backoff, resend what was not
    acknowledged, and the subscriber still gets every message (duplicates allowed, no gaps)."""
    proxy = TcpProxy(bridge.port).start()
    options = Options(
        port=proxy.port, lines=2, devices_per_line=3, count=600, rate=200, duration=30, seed=5
    )

    async def cut_while_running() -> Summary:
        simulation = asyncio.create_task(run(options))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(proxy.cut)
        await asyncio.sleep(0.5)
        proxy.heal()
        return await simulation

    try:
        with paho_client(bridge.port) as subscriber:
            subscribe_all(subscriber)
            summary = asyncio.run(cut_while_running())
            messages = receive(subscriber, 600)
    finally:
        proxy.stop()

    assert (summary.sent, summary.acked, summary.undelivered) == (600, 600, 0)
    assert summary.reconnects >= 6 and summary.errors >= 6
    seqs: dict[str, set[int]] = defaultdict(set)
    for message in messages:
        record, reason = validate(message.payload)
        assert record is not None, reason
        seqs[record["device"]].add(record["seq"])
    assert sum(len(numbers) for numbers in seqs.values()) == 600
    for device, numbers in seqs.items():
        assert numbers == set(range(len(numbers))), f"{device} has gaps"


class FakeBroker:
    """A broker on loopback that answers CONNECT and records every PUBLISH by connection number;
    on its first connection it acknowledges nothing and hangs up after `hang_up_after` publishes."""

    def __init__(self, hang_up_after: int) -> None:
        self.hang_up_after = hang_up_after
        self.received: list[tuple[int, Publish]] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        decoder = Decoder()
        try:
            while data := await reader.read(65536):
                decoder.feed(data)
                for packet in decoder.packets():
                    if isinstance(packet, Connect):
                        writer.write(codec.encode(Connack()))
                    elif isinstance(packet, Publish):
                        self.received.append((number, packet))
                        if number > 1 and packet.qos == 1:
                            writer.write(codec.encode(Puback(packet.packet_id or 0)))
                        elif number == 1 and len(self.received) == self.hang_up_after:
                            return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def simulate(self, **options: Any) -> Summary:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run(Options(port=port, lines=1, devices_per_line=1, **options))
        finally:
            server.close()
            await server.wait_closed()


def test_unacknowledged_messages_are_resent_with_dup_after_a_reconnect() -> None:
    """The window of 3 fills on a connection that never PUBACKs; after it drops, the device
    reconnects and resends those 3 (same packet ids, DUP set) before anything new."""
    broker = FakeBroker(hang_up_after=3)
    summary = asyncio.run(broker.simulate(count=8, rate=1000, duration=10, max_inflight=3))

    first = [packet for number, packet in broker.received if number == 1]
    second = [packet for number, packet in broker.received if number == 2]
    assert broker.connections == 2
    assert len(first) == 3 and not any(packet.dup for packet in first)
    assert all(packet.qos == 1 for packet in first + second)
    assert [(p.packet_id, p.payload, p.dup) for p in second[:3]] == [
        (p.packet_id, p.payload, True) for p in first
    ]
    assert len(second) == 8 and not any(packet.dup for packet in second[3:])
    assert [json.loads(p.payload)["seq"] for p in second[3:]] == [3, 4, 5, 6, 7]
    assert (summary.sent, summary.acked, summary.resent, summary.reconnects) == (8, 8, 3, 1)
    assert summary.errors >= 1 and summary.undelivered == 0


def test_qos0_messages_are_sent_without_packet_ids_or_acknowledgements() -> None:
    broker = FakeBroker(hang_up_after=0)
    summary = asyncio.run(broker.simulate(count=20, rate=1000, duration=10, qos=0))
    packets = [packet for _, packet in broker.received]
    assert len(packets) == 20
    assert all(packet.qos == 0 and packet.packet_id is None for packet in packets)
    assert (summary.sent, summary.acked, summary.undelivered) == (20, 0, 0)
