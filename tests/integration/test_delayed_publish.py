"""Delayed publish (`$delayed/<seconds>/<topic>`) on a real bridge process with the embedded
store: delivered at the due time and not before, kept across a kill -9, delivered once, bad
forms answered with a reason code (5.0) or a closed connection (3.1.1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel, Will
from bridge.mqtt.reasons import ReasonCode
from tests.support.admin_http import AdminHttp
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5, publish_bytes
from tests.support.processes import BridgeProcess
from tests.support.waiting import poll_until

pytestmark = pytest.mark.integration

R = ReasonCode
EARLY_MARGIN = 0.15
"""How much earlier than its due time a message may arrive (clock granularity, not design)."""
LATE_BOUND = 4.0
"""A generous bound on how late after its due time it may arrive on a shared, busy machine."""


def subscriber(port: int, client_id: str, topic_filter: str, qos: int = 1) -> RawClient:
    client = RawClient(port)
    assert client.connect(client_id, clean_session=False).return_code == 0
    assert client.subscribe(topic_filter, qos) == [qos]
    return client


def receive(client: RawClient, timeout: float) -> Publish:
    """The next PUBLISH, acknowledged as a client must."""
    packet = client.recv(timeout)
    assert isinstance(packet, Publish), packet
    if packet.qos == 1:
        client.send(Puback(packet.packet_id or 0))
    elif packet.qos == 2:
        client.send(Pubrec(packet.packet_id or 0))
        assert isinstance(client.recv(), Pubrel)
        client.send(Pubcomp(packet.packet_id or 0))
    return packet


def assert_nothing(client: RawClient, wait: float) -> None:
    try:
        packet = client.recv(wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected packet {packet}")


def test_a_delayed_publish_arrives_at_its_due_time_on_its_target_topic_not_before(
    bridge: BridgeProcess,
) -> None:
    target = subscriber(bridge.port, "target-reader", "alarm/+", 1)
    everything = subscriber(bridge.port, "hash-reader", "#", 1)
    delayed_reader = subscriber(bridge.port, "delayed-reader", "$delayed/#", 1)
    publisher = RawClient(bridge.port)
    assert publisher.connect("delayed-publisher").return_code == 0
    sent = time.monotonic()
    publisher.publish("$delayed/2/alarm/press3", b"late", qos=1, packet_id=7)
    assert time.monotonic() - sent < 1.0, "PUBACK must come when stored, not when due"
    message = receive(target, 2 + LATE_BOUND)
    arrived = time.monotonic() - sent
    assert arrived >= 2 - EARLY_MARGIN, f"delivered {arrived:.2f} s after publishing"
    assert (message.topic, message.payload, message.qos) == ("alarm/press3", b"late", 1)
    assert receive(everything, 2.0).topic == "alarm/press3"
    assert_nothing(delayed_reader, 0.5)  # nothing is ever published on a $delayed topic
    assert_nothing(target, 0.3)


def test_qos0_delayed_publish_is_stored_and_delivered_when_due(bridge: BridgeProcess) -> None:
    reader = subscriber(bridge.port, "qos0-reader", "q0/t", 0)
    publisher = RawClient(bridge.port)
    assert publisher.connect("qos0-publisher").return_code == 0
    sent = time.monotonic()
    publisher.publish("$delayed/1/q0/t", b"zero", qos=0)
    message = receive(reader, 1 + LATE_BOUND)
    assert time.monotonic() - sent >= 1 - EARLY_MARGIN
    assert (message.topic, message.payload, message.qos) == ("q0/t", b"zero", 0)


def test_retain_takes_effect_at_the_due_time(bridge: BridgeProcess) -> None:
    publisher = RawClient(bridge.port)
    assert publisher.connect("retain-publisher").return_code == 0
    publisher.publish("$delayed/2/state/door", b"open", qos=1, packet_id=1, retain=True)
    early = RawClient(bridge.port)
    assert early.connect("early-look").return_code == 0
    assert early.subscribe("state/door", 1) == [1]
    assert_nothing(early, 0.5)  # not retained yet
    live = receive(early, 2 + LATE_BOUND)
    assert (live.topic, live.payload, live.retain) == ("state/door", b"open", False)
    late = RawClient(bridge.port)
    assert late.connect("late-look").return_code == 0
    assert late.subscribe("state/door", 1) == [1]
    kept = receive(late, 3.0)
    assert (kept.payload, kept.retain) == (b"open", True)


def test_a_pending_delayed_publish_survives_a_kill_9_and_arrives_once(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    node = bridge_factory(data_dir=tmp_path / "node")
    reader = subscriber(node.port, "kill-reader", "kill/t", 2)
    reader.disconnect()  # a persistent session: its queue keeps filling while it is away
    publisher = RawClient(node.port)
    assert publisher.connect("kill-publisher").return_code == 0
    publisher.publish("$delayed/2/kill/t", b"pending", qos=2, packet_id=3)  # PUBREC: durable
    node.kill()
    restarted = bridge_factory(data_dir=tmp_path / "node", port=node.port)
    restarted.wait_for_log("delayed publishes pending")
    time.sleep(2.5)
    back = RawClient(restarted.port)
    assert back.connect("kill-reader", clean_session=False).return_code == 0
    message = receive(back, LATE_BOUND)
    assert (message.topic, message.payload) == ("kill/t", b"pending")
    assert_nothing(back, 1.0)


def test_a_delivered_delayed_publish_is_not_delivered_again_after_a_kill_9(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    node = bridge_factory(data_dir=tmp_path / "node")
    reader = subscriber(node.port, "once-reader", "once/t", 2)
    publisher = RawClient(node.port)
    assert publisher.connect("once-publisher").return_code == 0
    publisher.publish("$delayed/1/once/t", b"just once", qos=2, packet_id=4)
    assert receive(reader, 1 + LATE_BOUND).payload == b"just once"
    time.sleep(0.5)  # the subscriber's acknowledged offset is written (offset_flush_interval)
    node.kill()
    restarted = bridge_factory(data_dir=tmp_path / "node", port=node.port)
    back = RawClient(restarted.port)
    assert back.connect("once-reader", clean_session=False).return_code == 0
    assert_nothing(back, 2.0)
    assert "delayed publishes pending" not in restarted.log_text()


def test_an_overdue_delayed_publish_is_delivered_at_start_up(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    node = bridge_factory(data_dir=tmp_path / "node")
    reader = subscriber(node.port, "overdue-reader", "overdue/t", 1)
    reader.disconnect()
    publisher = RawClient(node.port)
    assert publisher.connect("overdue-publisher").return_code == 0
    publisher.publish("$delayed/1/overdue/t", b"missed", qos=1, packet_id=5)
    node.kill()
    time.sleep(1.5)  # due while the node is down
    restarted = bridge_factory(data_dir=tmp_path / "node", port=node.port)
    restarted.wait_for_log("1 of them overdue")
    back = RawClient(restarted.port)
    assert back.connect("overdue-reader", clean_session=False).return_code == 0
    assert receive(back, LATE_BOUND).payload == b"missed"


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("$delayed/abc/t", R.TOPIC_NAME_INVALID),
        ("$delayed/10", R.TOPIC_NAME_INVALID),
        ("$delayed/10/", R.TOPIC_NAME_INVALID),
        ("$delayed/-5/t", R.TOPIC_NAME_INVALID),
        ("$delayed/61/t", R.IMPLEMENTATION_SPECIFIC_ERROR),
    ],
)
def test_bad_delayed_forms_get_their_reason_code_in_mqtt5(
    bridge_factory: Callable[..., BridgeProcess], topic: str, reason: int
) -> None:
    node = bridge_factory("delayed_max_seconds=60")
    client = RawClient5(node.port)
    assert client.connect("bad-forms").return_code == 0
    client.send(Publish(topic, b"x", 1, False, packet_id=1))
    puback = client.recv()
    assert isinstance(puback, Puback) and puback.reason_code == reason, puback
    client.send(Publish(topic, b"x", 2, False, packet_id=2))
    pubrec = client.recv()
    assert isinstance(pubrec, Pubrec) and pubrec.reason_code == reason, pubrec
    node.wait_for_log(f"PUBLISH to {topic!r} dropped")
    # QoS 0 has no acknowledgement to carry the reason: DISCONNECT does.
    client.send(Publish(topic, b"x", 0, False))
    client.expect_disconnect(reason)


def test_a_bad_delayed_form_closes_a_311_connection_with_a_log_line(
    bridge: BridgeProcess,
) -> None:
    client = RawClient(bridge.port)
    assert client.connect("bad-311").return_code == 0
    client.send(Publish("$delayed/abc/t", b"x", 1, False, packet_id=1))
    client.expect_closed()
    bridge.wait_for_log("PUBLISH to '$delayed/abc/t': a delayed publish needs")


def test_the_acl_applies_to_the_target_topic(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    acl = tmp_path / "acl.conf"
    acl.write_text("deny  all publish secret/#\nallow all all     #\n")
    node = bridge_factory(f"acl_file={acl}")
    reader = subscriber(node.port, "secret-reader", "secret/#", 1)
    client = RawClient5(node.port)
    assert client.connect("smuggler").return_code == 0
    client.send(Publish("$delayed/1/secret/plans", b"x", 1, False, packet_id=1))
    puback = client.recv()
    assert isinstance(puback, Puback) and puback.reason_code == R.NOT_AUTHORIZED, puback
    assert_nothing(reader, 2.0)


def delayed_metrics(api: AdminHttp) -> dict[str, float]:
    status, text = api.get("/metrics")
    assert status == 200
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("mqtt_bridge_delayed_")
    }


def test_delayed_publishes_are_counted(admin_node: tuple[BridgeProcess, AdminHttp]) -> None:
    node, api = admin_node
    reader = subscriber(node.port, "counted-reader", "counted/t", 1)
    publisher = RawClient(node.port)
    assert publisher.connect("counted-publisher").return_code == 0
    publisher.publish("$delayed/1/counted/t", b"x", qos=1, packet_id=1)
    assert delayed_metrics(api) == {
        "mqtt_bridge_delayed_scheduled_total": 1,
        "mqtt_bridge_delayed_delivered_total": 0,
        "mqtt_bridge_delayed_refused_total": 0,
        "mqtt_bridge_delayed_pending": 1,
        "mqtt_bridge_delayed_bytes": len(b"x") + len("counted/t"),
    }
    receive(reader, 1 + LATE_BOUND)
    publisher.send(Publish("$delayed/x/counted/t", b"x", 1, False, packet_id=2))
    publisher.expect_closed()
    # The delivery is counted once its append is durable, which a subscriber reading the log
    # early may precede.
    after = {
        "mqtt_bridge_delayed_scheduled_total": 1,
        "mqtt_bridge_delayed_delivered_total": 1,
        "mqtt_bridge_delayed_refused_total": 1,
        "mqtt_bridge_delayed_pending": 0,
        "mqtt_bridge_delayed_bytes": 0,
    }
    poll_until(lambda: delayed_metrics(api) == after, 10)
    assert delayed_metrics(api) == after


def test_a_wildcard_in_the_target_is_a_malformed_publish_as_for_any_topic(
    bridge: BridgeProcess,
) -> None:
    client = RawClient5(bridge.port)
    assert client.connect("wildcard-target").return_code == 0
    client.send_bytes(publish_bytes("$delayed/10/a/+", b"x", 1, 1))
    client.expect_disconnect(R.MALFORMED_PACKET)


@pytest.mark.parametrize("topic", ["$delayed/5/alarm/t", "$SYS/brokers/x"])
def test_a_will_on_a_reserved_topic_is_refused_at_connect_in_both_versions(
    bridge: BridgeProcess, topic: str
) -> None:
    """A will is delayed by its Will Delay Interval, never by a `$delayed/` topic, and may not
    write the broker's `$SYS` tree: CONNACK 0x90 (5.0) / 5 (3.1.1), and a log line."""
    will = Will(topic, b"gone", 1, False)
    client5 = RawClient5(bridge.port)
    try:
        assert client5.connect("will-v5", will=will).return_code == R.TOPIC_NAME_INVALID
    finally:
        client5.close()
    client = RawClient(bridge.port)
    try:
        assert client.connect("will-v3", will=will).return_code == 0x05
    finally:
        client.close()
    bridge.wait_for_log("is reserved")
