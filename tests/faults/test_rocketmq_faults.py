"""kill -9 faults with `store=rocketmq`: of the RocketMQ broker under QoS 1 load, and of the bridge
with QoS 2 handshakes open on either side.

The test that kills the broker starts its own NameServer + broker (SYNC_FLUSH) in its tmp_path,
so the kill touches no other test, and stops it at the end; the tests that kill the bridge use
the session's broker (SYNC_FLUSH too), each bridge in a namespace of its own. The clients behave
as the spec requires of a client (reconnect with their persistent session, resend
unacknowledged PUBLISHes with DUP and PUBRELs, keep QoS 2 receive state by packet id), so what
is tested is the bridge's half: a PUBACK or PUBREC only for what RocketMQ answered SEND_OK,
nothing acknowledged lost, no QoS 2 message delivered twice. Counts are printed (`pytest -s`)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.mqtt.packets import Pubcomp, Publish, Pubrec, Pubrel
from tests.support.clients import RawClient
from tests.support.load import (
    Qos1Publisher,
    Qos1Subscriber,
    ReconnectingClient,
    finish,
)
from tests.support.processes import BridgeProcess
from tests.support.qos import ExactlyOnceReceiver
from tests.support.rocketmq import LocalRocketMQ
from tests.support.rocketmq_use import own_rocketmq, rocketmq_nodes
from tests.support.waiting import poll_until, wait_until

pytestmark = [pytest.mark.fault, pytest.mark.rocketmq, pytest.mark.timeout(300)]

SEND_TIMEOUT = 3.0
"""The bridge's `rocketmq_send_timeout`: an unanswered send fails (and closes the publisher's
connection) after this long."""
# Generous: two cores shared with other jobs, a JVM broker and the bridge on them.
DELIVERY_TIMEOUT = 90.0
QUIET = 2.0
"""How long nothing more may arrive after the expected messages (duplicates)."""


@pytest.fixture
def mq(tmp_path: Path) -> Iterator[LocalRocketMQ]:
    """This test's own NameServer + broker; always stopped (SIGKILL) at the end."""
    with own_rocketmq(tmp_path / "rocketmq", timer=False) as rocketmq:
        yield rocketmq


@pytest.fixture
def start_bridge(
    mq: LocalRocketMQ, bridge_factory: Callable[..., BridgeProcess]
) -> Callable[..., BridgeProcess]:
    """Start a store=rocketmq node on `mq` (bridge_factory kills it before `mq` stops)."""
    return rocketmq_nodes(bridge_factory, mq, f"rocketmq_send_timeout={SEND_TIMEOUT:g}")


@pytest.fixture
def start_bridge_on_session_broker(
    rocketmq: LocalRocketMQ, bridge_factory: Callable[..., BridgeProcess]
) -> Callable[..., BridgeProcess]:
    """Start a store=rocketmq node on the session's broker, in a namespace of this test's own."""
    return rocketmq_nodes(
        bridge_factory,
        rocketmq,
        f"rocketmq_send_timeout={SEND_TIMEOUT:g}",
        f"rocketmq_namespace=kill{uuid.uuid4().hex[:8]}",
    )


def assert_exactly_once(delivered: Counter[str], expected: set[str]) -> None:
    missing = expected - set(delivered)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    extra = set(delivered) - expected
    assert not extra, f"unexpected messages {sorted(extra)[:5]}"
    twice = {p: n for p, n in delivered.items() if n != 1}
    assert not twice, f"QoS 2 delivered more than once: {sorted(twice.items())[:5]}"


# --- 1. kill -9 of the RocketMQ broker under QoS 1 load ------------------------------------------


def test_kill_9_of_rocketmq_broker_under_qos1_load_loses_no_pubacked_message(mq, start_bridge):
    bridge = start_bridge()
    setup = RawClient(bridge.port)
    setup.connect("keeper", clean_session=False)
    assert setup.subscribe("load/#", 1) == [1]
    setup.disconnect()
    subscriber = Qos1Subscriber(bridge.port, "keeper")
    subscriber.start()

    stop = threading.Event()
    publishers = [Qos1Publisher(bridge.port, f"pub{i}", stop) for i in range(2)]
    for publisher in publishers:
        publisher.start()

    def acked() -> int:
        return sum(len(p.acks) for p in publishers)

    def closes_since(moment: float) -> int:
        return sum(1 for p in publishers for t in p.closed_at if t > moment)

    try:
        wait_until(lambda: acked() >= 150, 90, "150 PUBACKs before the kill")
        acked_at_kill = acked()
        mq.kill_broker()
        killed_at = time.monotonic()
        # Keep the broker down past the send time-out, until the bridge has refused every
        # publisher at least twice (each reconnected and resent in between).
        wait_until(
            lambda: (
                time.monotonic() - killed_at > SEND_TIMEOUT + 1
                and all(sum(1 for t in p.closed_at if t > killed_at) >= 2 for p in publishers)
            ),
            60,
            "the bridge to close the publishers' connections while RocketMQ is down",
        )
        restarting_at = time.monotonic()
        acked_while_down = acked()
        mq.start_broker()
        restarted_at = time.monotonic()
        wait_until(lambda: acked() >= acked_while_down + 150, 120, "150 PUBACKs after the restart")
    finally:
        stop.set()
    finish(stop, publishers)

    published = set().union(*(p.published for p in publishers))
    pubacked = set().union(*(p.acked for p in publishers))
    assert pubacked == published  # every publisher finished: all it sent was acknowledged
    try:
        if poll_until(lambda: pubacked <= set(subscriber.delivered), DELIVERY_TIMEOUT):
            time.sleep(QUIET)  # let stray redeliveries arrive before counting duplicates
    finally:
        subscriber.stop.set()
        subscriber.join(10)

    delivered = subscriber.delivered
    duplicates = sum(n - 1 for n in delivered.values())
    # PUBACKs the publishers read in the first moment after the kill are for sends RocketMQ
    # answered SEND_OK before it died; after that, none may come until it is back.
    grace = 1.5
    after_kill = sorted(
        t - killed_at for p in publishers for t, _ in p.acks if killed_at < t < restarting_at
    )
    down_acks = sorted(
        t - killed_at
        for p in publishers
        for t, _ in p.acks
        if killed_at + grace < t < restarting_at
    )
    print(
        f"\nbroker kill: published {len(published)}, PUBACKed {len(pubacked)} "
        f"({acked_at_kill} before kill_broker was called, {acked_while_down - acked_at_kill} "
        f"later while the broker was dying or down, of which {len(after_kill)} read after "
        f"kill_broker returned, the last at +{max(after_kill, default=0):.2f} s; down for "
        f"{restarting_at - killed_at:.1f} s, restart took {restarted_at - restarting_at:.1f} s), "
        f"delivered {len(delivered)} distinct / "
        f"{sum(delivered.values())} total, duplicates {duplicates} "
        f"({subscriber.dup_flagged} with DUP=1), publisher connections closed "
        f"{sum(len(p.closed_at) for p in publishers)} ({closes_since(killed_at)} after "
        f"kill_broker returned), resent {sum(p.resent for p in publishers)}, subscriber reconnects "
        f"{subscriber.reconnects}"
    )
    assert not down_acks, (
        f"{len(down_acks)} PUBACKs while RocketMQ was down, at {down_acks[:5]} s after the kill"
    )
    lost = pubacked - set(delivered)
    assert not lost, f"{len(lost)} PUBACKed messages lost, e.g. {sorted(lost)[:5]}"
    assert set(delivered) <= published


# --- 2. kill -9 of the bridge with an offline QoS 2 subscriber ------------------------------------


def _queue_qos2_while_offline(
    bridge: Any,
    subscriber: ExactlyOnceReceiver,
    topic_filter: str,
    topic_of: Callable[[int], str],
    *,
    clean_session: bool = True,
    count: int = 60,
) -> list[str]:
    """Subscribe `subscriber` at QoS 2 and go offline; publish `count` QoS 2 messages, each to
    PUBCOMP. Returns their payloads."""
    assert subscriber.connect().subscribe(topic_filter, 2) == [2]
    assert subscriber.client is not None
    subscriber.client.disconnect()
    payloads = [f"q2-{i}" for i in range(count)]
    publisher = RawClient(bridge.port)
    publisher.connect("pub", clean_session=clean_session)
    for i, payload in enumerate(payloads):
        publisher.publish(topic_of(i), payload.encode(), 2, packet_id=i + 1)
    publisher.disconnect()
    return payloads


def test_offline_qos2_subscriber_gets_every_message_once_after_kill_9_of_the_bridge(
    start_bridge_on_session_broker,
):
    bridge = start_bridge_on_session_broker()
    subscriber = ExactlyOnceReceiver(bridge.port, "offline-sub")
    payloads = _queue_qos2_while_offline(
        bridge, subscriber, "inbox/#", lambda i: f"inbox/dev{i % 3}", clean_session=False
    )

    bridge.kill()
    bridge.start()
    subscriber.connect()
    subscriber.receive(until=len(payloads), timeout=DELIVERY_TIMEOUT)
    subscriber.receive(until=len(payloads) + 1, timeout=QUIET)  # any stray redelivery
    subscriber.client.disconnect()
    print(
        f"\noffline subscriber: published {len(payloads)} (all PUBCOMPed), delivered "
        f"{len(subscriber.delivered)} distinct / {sum(subscriber.delivered.values())} total"
    )
    assert_exactly_once(subscriber.delivered, set(payloads))


# --- 3. kill -9 of the bridge mid-way through QoS 2 deliveries ------------------------------------


class WithholdingReceiver(ExactlyOnceReceiver):
    """Completes QoS 2 handshakes but, while `withholding`, never sends the PUBREC of every 5th
    PUBLISH nor the PUBCOMP of every 4th PUBREL, so handshakes stay open in both phases."""

    def __init__(self, port: int, client_id: str) -> None:
        super().__init__(port, client_id)
        self.withholding = True
        self.publishes = 0
        self.pubrels = 0
        self.withheld_pubrec: list[int] = []
        self.withheld_pubcomp: list[int] = []

    def handle(self, packet: object) -> None:
        assert self.client is not None
        if self.withholding and isinstance(packet, Publish) and packet.qos == 2:
            self.publishes += 1
            if self.publishes % 5 == 0:
                packet_id = packet.packet_id or 0
                if packet_id not in self.awaiting_pubrel:
                    self.delivered[packet.payload.decode()] += 1
                    self.awaiting_pubrel.add(packet_id)
                self.withheld_pubrec.append(packet_id)
                return
        elif self.withholding and isinstance(packet, Pubrel):
            self.pubrels += 1
            if self.pubrels % 4 == 0:
                self.awaiting_pubrel.discard(packet.packet_id)
                self.withheld_pubcomp.append(packet.packet_id)
                return
        super().handle(packet)


def test_kill_9_of_the_bridge_mid_qos2_delivery_delivers_each_message_exactly_once(
    start_bridge_on_session_broker,
):
    bridge = start_bridge_on_session_broker()
    subscriber = WithholdingReceiver(bridge.port, "mid-sub")
    payloads = _queue_qos2_while_offline(bridge, subscriber, "meter/#", lambda i: "meter/a")

    client = subscriber.connect()
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    while not (
        len(subscriber.delivered) >= 20
        and subscriber.withheld_pubrec
        and subscriber.withheld_pubcomp
        and subscriber.awaiting_pubrel
    ):
        assert time.monotonic() < deadline, (
            f"stuck before the kill: {len(subscriber.delivered)} delivered, "
            f"withheld PUBREC {subscriber.withheld_pubrec}, PUBCOMP {subscriber.withheld_pubcomp}"
        )
        try:
            subscriber.handle(client.recv(1.0))
        except TimeoutError:
            continue
    bridge.kill()
    delivered_before = len(subscriber.delivered)
    open_before = (
        len(subscriber.awaiting_pubrel),
        len(subscriber.withheld_pubrec),
        len(subscriber.withheld_pubcomp),
    )
    assert delivered_before < len(payloads)

    bridge.start()
    subscriber.withholding = False
    subscriber.connect()  # the bridge resends PUBLISH (DUP) or PUBREL for what is open
    subscriber.receive(until=len(payloads), timeout=DELIVERY_TIMEOUT)
    subscriber.receive(until=len(payloads) + 1, timeout=QUIET)
    assert subscriber.client is not None
    subscriber.client.disconnect()
    print(
        f"\nmid-delivery kill: published {len(payloads)}, delivered {delivered_before} before "
        f"the kill with {open_before[0]} awaiting PUBREL ({open_before[1]} PUBRECs and "
        f"{open_before[2]} PUBCOMPs withheld), {len(subscriber.delivered)} distinct / "
        f"{sum(subscriber.delivered.values())} total after"
    )
    assert_exactly_once(subscriber.delivered, set(payloads))


# --- 4. kill -9 of the bridge while a QoS 2 publisher is mid-stream -------------------------------


class PipelinedQos2Publisher(ReconnectingClient):
    """Publishes QoS 2 messages with up to `window` handshakes open. After a broken connection it
    reconnects with the same ClientId (clean session 0) and, in the original order, resends
    PUBREL for what was PUBRECed and the PUBLISH with DUP=1 for the rest (MQTT-4.4.0-1)."""

    def __init__(self, port: int, client_id: str, payloads: list[str], window: int = 10) -> None:
        super().__init__(name=client_id, daemon=True)
        self.port = port
        self.client_id = client_id
        self.payloads = payloads
        self.window = window
        self.next_index = 0
        self.open: dict[int, str] = {}  # packet id -> payload, handshake not complete
        self.released: set[int] = set()  # PUBREC received, PUBREL sent
        self.completed: list[str] = []
        self.resent_publish = 0
        self.resent_pubrel = 0
        self.connection_losses = 0
        self.error: BaseException | None = None
        self.deadline = time.monotonic() + 200

    def _lost(self) -> None:
        self.connection_losses += 1

    def _unfinished(self) -> str:
        return f"not done, {len(self.open)} open"

    def _session(self) -> bool:
        client = RawClient(self.port, timeout=15)
        try:
            client.connect(self.client_id, clean_session=False)
            for packet_id in sorted(self.open):
                if packet_id in self.released:
                    self.resent_pubrel += 1
                    client.send(Pubrel(packet_id))
                else:
                    self.resent_publish += 1
                    client.send(self._publish(packet_id, dup=True))
            while True:
                while len(self.open) < self.window and self.next_index < len(self.payloads):
                    packet_id = self.next_index + 1
                    self.open[packet_id] = self.payloads[self.next_index]
                    self.next_index += 1
                    client.send(self._publish(packet_id, dup=False))
                if not self.open:
                    client.disconnect()
                    return True
                packet = client.recv()
                if isinstance(packet, Pubrec) and packet.packet_id in self.open:
                    self.released.add(packet.packet_id)
                    client.send(Pubrel(packet.packet_id))
                elif isinstance(packet, Pubcomp) and packet.packet_id in self.released:
                    self.released.discard(packet.packet_id)
                    self.completed.append(self.open.pop(packet.packet_id))
        finally:
            client.close()

    def _publish(self, packet_id: int, dup: bool) -> Publish:
        payload = self.open[packet_id]
        return Publish(f"stream/{payload}", payload.encode(), 2, dup=dup, packet_id=packet_id)


def test_qos2_publisher_resuming_after_kill_9_of_the_bridge_stores_each_message_once(
    start_bridge_on_session_broker,
):
    bridge = start_bridge_on_session_broker()
    subscriber = ExactlyOnceReceiver(bridge.port, "stream-sub")
    assert subscriber.connect().subscribe("stream/#", 2) == [2]
    assert subscriber.client is not None
    subscriber.client.disconnect()

    payloads = [f"q2-{i}" for i in range(200)]
    publisher = PipelinedQos2Publisher(bridge.port, "stream-pub", payloads)
    publisher.start()
    try:
        wait_until(lambda: len(publisher.completed) >= 60, 90, "60 PUBCOMPs before the kill")
        bridge.kill()
        completed_at_kill = len(publisher.completed)
        bridge.start()
    finally:
        publisher.join(200)
    assert publisher.error is None, repr(publisher.error)
    assert not publisher.is_alive()
    assert sorted(publisher.completed) == sorted(payloads)
    assert completed_at_kill < len(payloads)
    assert publisher.connection_losses >= 1
    assert publisher.resent_publish + publisher.resent_pubrel >= 1, "nothing was open at the kill"

    subscriber.connect()
    subscriber.receive(until=len(payloads), timeout=DELIVERY_TIMEOUT)
    subscriber.receive(until=len(payloads) + 1, timeout=QUIET)
    subscriber.client.disconnect()
    print(
        f"\npublisher mid-stream kill: published {len(payloads)}, {completed_at_kill} PUBCOMPed "
        f"before the kill, resent {publisher.resent_publish} PUBLISH (DUP) and "
        f"{publisher.resent_pubrel} PUBREL after it; delivered {len(subscriber.delivered)} "
        f"distinct / {sum(subscriber.delivered.values())} total"
    )
    assert_exactly_once(subscriber.delivered, set(payloads))
