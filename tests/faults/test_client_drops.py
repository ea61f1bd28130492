"""Clients that vanish mid-handshake lose nothing and never get a QoS 2 message twice.

Publisher and subscriber drop their TCP connection at every point of the QoS 1/2 handshakes
(after PUBLISH, after PUBREC, after PUBREL) and reconnect with their persistent sessions, doing
what the spec asks of a client on reconnection. Every message is counted at the end."""

from __future__ import annotations

import random

import pytest

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.clients import RawClient
from tests.support.qos import ExactlyOnceReceiver

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


class FlakySubscriber(ExactlyOnceReceiver):
    """Drops its connection at random handshake steps (15% of the time) and reconnects."""

    def __init__(self, port: int, rng: random.Random) -> None:
        super().__init__(port, "flaky-sub")
        self.rng = rng
        self.drops = 0
        self.connect()

    def drop(self, step: str) -> bool:
        if self.rng.random() < 0.15:
            self.drops += 1
            self.connect()
            return True
        return False


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

    subscriber.connect()
    subscriber.receive(until=len(messages), timeout=60)
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
    subscriber.receive(until=len(messages), timeout=60)
    assert subscriber.drops > 5, "the test did not exercise any drop"
    received = subscriber.delivered
    assert set(received) == {p for p, _ in messages}, "messages lost"
    twice = [p for p, q in messages if q == 2 and received[p] != 1]
    assert not twice, f"QoS 2 delivered more than once: {twice[:5]}"
