"""Clients that vanish mid-handshake lose nothing and never get a QoS 2 message twice.

Publisher and subscriber drop their TCP connection at every point of the QoS 1/2 handshakes
(after PUBLISH, after PUBREC, after PUBREL) and reconnect with their persistent sessions, doing
what the spec asks of a client on reconnection. Every message is counted at the end."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.clients import RawClient

pytestmark = pytest.mark.fault

TOPIC = "line/7/counter"


class FlakyPublisher:
    """Publishes, sometimes dropping the connection at a chosen step of the handshake."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.client = self._connect()

    def _connect(self) -> RawClient:
        client = RawClient(self.port)
        client.connect("flaky-pub", clean_session=False)
        return client

    def _reconnect(self) -> None:
        self.client.close()
        self.client = self._connect()

    def publish(self, payload: str, qos: int, packet_id: int, drop: str | None) -> None:
        client = self.client
        client.send(Publish(TOPIC, payload.encode(), qos, packet_id=packet_id))
        if drop == "after-publish":
            self._reconnect()  # the spec: resend the PUBLISH with DUP=1
            self.client.send(Publish(TOPIC, payload.encode(), qos, dup=True, packet_id=packet_id))
        ack = self.client.recv()
        if qos == 1:
            assert isinstance(ack, Puback) and ack.packet_id == packet_id
            return
        assert isinstance(ack, Pubrec) and ack.packet_id == packet_id
        if drop == "after-pubrec":
            self._reconnect()  # the spec: it got PUBREC, so it sends PUBREL (not PUBLISH)
        self.client.send(Pubrel(packet_id))
        if drop == "after-pubrel":
            self._reconnect()
            self.client.send(Pubrel(packet_id))
        comp = self.client.recv()
        assert isinstance(comp, Pubcomp) and comp.packet_id == packet_id


class FlakySubscriber:
    """Receives like a compliant client and drops the connection at chosen handshake steps."""

    def __init__(self, port: int, rng: random.Random) -> None:
        self.port = port
        self.rng = rng
        self.delivered: Counter[str] = Counter()
        self.awaiting_pubrel: set[int] = set()
        self.drops = 0
        self.client = self._connect()

    def _connect(self) -> RawClient:
        client = RawClient(self.port)
        client.connect("flaky-sub", clean_session=False)
        return client

    def _maybe_drop(self) -> bool:
        if self.rng.random() < 0.15:
            self.drops += 1
            self.client.close()
            self.client = self._connect()
            return True
        return False

    def run(self, expected: int, rounds: int = 5000) -> None:
        for _ in range(rounds):
            if len(self.delivered) >= expected and not self.awaiting_pubrel:
                return
            try:
                packet = self.client.recv(2.0)
            except TimeoutError:
                if len(self.delivered) >= expected:
                    return
                continue
            if isinstance(packet, Publish):
                if packet.qos == 2:
                    if packet.packet_id not in self.awaiting_pubrel:
                        self.delivered[packet.payload.decode()] += 1
                        self.awaiting_pubrel.add(packet.packet_id)
                    if self._maybe_drop():  # gone before PUBREC
                        continue
                    self.client.send(Pubrec(packet.packet_id))
                    self._maybe_drop()  # gone after PUBREC, before PUBREL
                else:
                    self.delivered[packet.payload.decode()] += 1
                    if packet.qos == 1 and not self._maybe_drop():
                        self.client.send(Puback(packet.packet_id))
            elif isinstance(packet, Pubrel):
                self.awaiting_pubrel.discard(packet.packet_id)
                if self._maybe_drop():  # gone before PUBCOMP: the PUBREL comes again
                    self.awaiting_pubrel.add(packet.packet_id)
                    continue
                self.client.send(Pubcomp(packet.packet_id))


def test_publisher_dropping_at_every_handshake_step_stores_each_message_once(bridge):
    subscriber = FlakySubscriber(bridge.port, random.Random(1))
    subscriber.client.subscribe(TOPIC, 2)
    subscriber.client.disconnect()  # offline while the publisher struggles

    publisher = FlakyPublisher(bridge.port)
    drops = [None, "after-publish", "after-pubrec", "after-pubrel"]
    messages = []
    for i in range(80):
        qos = 1 + i % 2
        drop = drops[i % 4] if qos == 2 else (None if i % 3 else "after-publish")
        payload = f"q{qos}-{i}"
        publisher.publish(payload, qos, packet_id=i % 50 + 1, drop=drop)
        messages.append((payload, qos))
    publisher.client.disconnect()

    subscriber.client = subscriber._connect()
    subscriber.run(expected=len(messages))
    received = subscriber.delivered
    assert set(received) == {p for p, _ in messages}
    assert all(received[p] == 1 for p, q in messages if q == 2), "a QoS 2 message came twice"


@pytest.mark.parametrize("seed", [3, 11])
def test_subscriber_dropping_mid_handshake_gets_every_message_and_qos2_once(bridge, seed):
    subscriber = FlakySubscriber(bridge.port, random.Random(seed))
    subscriber.client.subscribe(TOPIC, 2)
    publisher = RawClient(bridge.port)
    publisher.connect("steady-pub")
    messages = [(f"q{1 + i % 2}-{i}", 1 + i % 2) for i in range(120)]
    for i, (payload, qos) in enumerate(messages):
        publisher.publish(TOPIC, payload.encode(), qos, packet_id=i % 100 + 1)
    subscriber.run(expected=len(messages))
    assert subscriber.drops > 5, "the test did not exercise any drop"
    received = subscriber.delivered
    assert set(received) == {p for p, _ in messages}, "messages lost"
    twice = [p for p, q in messages if q == 2 and received[p] != 1]
    assert not twice, f"QoS 2 delivered more than once: {twice[:5]}"
