"""Publish/subscribe through a real bridge: QoS, overlap, retained, wills, sessions, shared
subscriptions and limits, with real clients (paho-mqtt, mosquitto_pub/sub) and a raw client where
exact flags and packet ids matter."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from bridge.mqtt import codec
from bridge.mqtt.packets import (
    SUBACK_FAILURE,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Will,
)
from tests.support.clients import RawClient, paho_client

pytestmark = pytest.mark.integration


def recv_publish(client: RawClient, timeout: float = 5.0) -> Publish:
    packet = client.recv(timeout)
    assert isinstance(packet, Publish), packet
    return packet


def subscribe_then_go_offline(port: int, client_id: str, topic_filter: str, qos: int) -> None:
    """A persistent session subscribes and disconnects: messages now queue for it."""
    client = RawClient(port)
    client.connect(client_id, clean_session=False)
    client.subscribe(topic_filter, qos)
    client.disconnect()


def drain_qos1(client: RawClient, idle: float = 1.0) -> list[bytes]:
    """Receive and PUBACK messages until none arrives for `idle` seconds; their payloads."""
    payloads = []
    while True:
        try:
            message = recv_publish(client, timeout=idle)
        except TimeoutError:
            return payloads
        client.send(Puback(message.packet_id))
        payloads.append(message.payload)


def assert_nothing(client: RawClient, wait: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        client.recv(wait)


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivered_qos_is_the_minimum_of_publish_and_subscription_MQTT_3_8_4_6(
    bridge, pub_qos, sub_qos
):
    sub = RawClient(bridge.port)
    sub.connect("sub")
    assert sub.subscribe("m/q", sub_qos) == [sub_qos]
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("m/q", b"hello", pub_qos, packet_id=7 if pub_qos else None)
    message = recv_publish(sub)
    assert (message.topic, message.payload) == ("m/q", b"hello")
    assert message.qos == min(pub_qos, sub_qos)
    assert message.retain is False
    if message.qos == 1:
        sub.send(Puback(message.packet_id))
    elif message.qos == 2:
        sub.send(Pubrec(message.packet_id))
        assert isinstance(sub.recv(), Pubrel)
        sub.send(Pubcomp(message.packet_id))
    pub.disconnect()
    sub.disconnect()


def test_paho_qos1_and_qos2_round_trip_in_order(bridge):
    """Order is checked on the wire (a raw subscriber sees every PUBLISH as sent) and per QoS at
    paho's application callback: paho hands a QoS 2 message over only when its PUBREL arrives,
    so between a QoS 1 and a QoS 2 message its callback order is not the wire order."""
    wire = RawClient(bridge.port)
    wire.connect("wire-order")
    assert wire.subscribe("orders/#", 2) == [2]
    with paho_client(bridge.port) as sub, paho_client(bridge.port) as pub:
        sub.client.subscribe("orders/#", 2)
        time.sleep(0.3)
        for i in range(50):
            pub.client.publish(f"orders/{i % 3}", f"m{i}".encode(), qos=1 + i % 2).wait_for_publish(
                5
            )
        got = sub.drain(50)
        assert len(got) == 50
        per_topic: dict[tuple[str, int], list[int]] = {}
        for msg in got:
            per_topic.setdefault((msg.topic, msg.qos), []).append(int(msg.payload[1:]))
        for numbers in per_topic.values():
            assert numbers == sorted(numbers)
    on_wire: dict[str, list[int]] = {}
    while sum(map(len, on_wire.values())) < 50:
        packet = wire.recv()
        if isinstance(packet, Publish):
            on_wire.setdefault(packet.topic, []).append(int(packet.payload[1:]))
            if packet.qos == 1:
                wire.send(Puback(packet.packet_id))
            else:
                wire.send(Pubrec(packet.packet_id))
        elif isinstance(packet, Pubrel):
            wire.send(Pubcomp(packet.packet_id))
    for numbers in on_wire.values():
        assert numbers == sorted(numbers)
    wire.disconnect()


def test_overlapping_subscriptions_deliver_once_at_highest_qos_MQTT_3_3_5_1(bridge):
    sub = RawClient(bridge.port)
    sub.connect("overlap")
    sub.subscribe("a/#", 0, packet_id=1)
    sub.subscribe("a/+/c", 2, packet_id=2)
    sub.subscribe("a/b/c", 1, packet_id=3)
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("a/b/c", b"x", 2, packet_id=1)
    message = recv_publish(sub)
    assert message.qos == 2
    sub.send(Pubrec(message.packet_id))
    assert isinstance(sub.recv(), Pubrel)
    sub.send(Pubcomp(message.packet_id))
    assert_nothing(sub)
    pub.publish("a/x", b"y", 0)
    assert recv_publish(sub).qos == 0
    assert_nothing(sub)


def test_wildcards_at_first_level_do_not_match_dollar_topics_MQTT_4_7_2_1(bridge):
    sub = RawClient(bridge.port)
    sub.connect("dollar")
    sub.subscribe("#", 0, packet_id=1)
    sub.subscribe("$app/#", 0, packet_id=2)
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("$app/x", b"1", 0)
    message = recv_publish(sub)
    assert message.topic == "$app/x"
    assert_nothing(sub)


def test_invalid_topic_filter_gets_suback_failure_0x80(bridge):
    client = RawClient(bridge.port)
    client.connect("badfilter")
    assert client.subscribe("a/#/b", 1) == [SUBACK_FAILURE]
    assert client.subscribe("a+/b", 1, packet_id=2) == [SUBACK_FAILURE]
    assert client.subscribe("ok/+", 1, packet_id=3) == [1]
    bridge.wait_for_log("refused (0x80)")


def test_retained_message_is_set_replaced_and_deleted_MQTT_3_3_1_5_to_11(bridge):
    pub = RawClient(bridge.port)
    pub.connect("retainer")
    pub.publish("r/t", b"first", 1, packet_id=1, retain=True)
    pub.publish("r/t", b"second", 1, packet_id=2, retain=True)
    sub = RawClient(bridge.port)
    sub.connect("late")
    sub.subscribe("r/#", 1)
    message = recv_publish(sub)
    assert (message.payload, message.retain, message.qos) == (b"second", True, 1)
    sub.send(Puback(message.packet_id))
    # a live delivery carries RETAIN=0 even if published with RETAIN=1 (MQTT-3.3.1-9)
    pub.publish("r/t", b"third", 0, retain=True)
    live = recv_publish(sub)
    assert (live.payload, live.retain) == (b"third", False)
    # a zero-length retained payload deletes the retained message (MQTT-3.3.1-10)
    pub.publish("r/t", b"", 0, retain=True)
    recv_publish(sub)
    other = RawClient(bridge.port)
    other.connect("later")
    other.subscribe("r/#", 1)
    assert_nothing(other)


def test_retained_message_survives_restart(bridge):
    pub = RawClient(bridge.port)
    pub.connect("retainer")
    pub.publish("state/dev1", b"RUNNING", 1, packet_id=1, retain=True)
    pub.disconnect()
    bridge.kill()
    bridge.start()
    sub = RawClient(bridge.port)
    sub.connect("reader")
    sub.subscribe("state/+", 0)
    message = recv_publish(sub)
    assert (message.topic, message.payload, message.retain) == ("state/dev1", b"RUNNING", True)


def test_will_is_published_when_the_connection_drops_MQTT_3_1_2_8(bridge):
    watcher = RawClient(bridge.port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 1)
    dying = RawClient(bridge.port)
    dying.connect("dying", will=Will("wills/dying", b"gone", 1, False))
    dying.close()  # no DISCONNECT
    message = recv_publish(watcher)
    assert (message.topic, message.payload, message.qos) == ("wills/dying", b"gone", 1)


def test_will_is_not_published_after_disconnect_MQTT_3_1_2_10(bridge):
    watcher = RawClient(bridge.port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 0)
    polite = RawClient(bridge.port)
    polite.connect("polite", will=Will("wills/polite", b"gone", 0, False))
    polite.disconnect()
    assert_nothing(watcher, 1.0)


def test_will_is_published_on_keepalive_timeout(bridge):
    watcher = RawClient(bridge.port, timeout=6)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 0)
    silent = RawClient(bridge.port)
    silent.connect("silent", keepalive=1, will=Will("wills/silent", b"timeout", 0, False))
    message = recv_publish(watcher, timeout=6)
    assert message.payload == b"timeout"
    silent.close()


def test_will_of_client_connected_at_crash_is_published_after_restart(bridge):
    dying = RawClient(bridge.port)
    dying.connect("crash-victim", will=Will("wills/crash", b"node died", 1, True))
    bridge.kill()
    dying.close()
    bridge.start()
    watcher = RawClient(bridge.port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 1)
    message = recv_publish(watcher)  # retained will, published at start-up
    assert (message.topic, message.payload) == ("wills/crash", b"node died")


def test_persistent_session_keeps_subscriptions_and_queues_offline_messages_MQTT_3_1_2_4(
    bridge,
):
    sub = RawClient(bridge.port)
    assert sub.connect("keeper", clean_session=False).session_present is False
    sub.subscribe("inbox/#", 1)
    sub.disconnect()
    pub = RawClient(bridge.port)
    pub.connect("sender")
    for i in range(5):
        pub.publish(f"inbox/{i}", f"m{i}".encode(), 1, packet_id=i + 1)
    sub = RawClient(bridge.port)
    assert sub.connect("keeper", clean_session=False).session_present is True
    payloads = []
    for _ in range(5):
        message = recv_publish(sub)
        payloads.append(message.payload)
        sub.send(Puback(message.packet_id))
    assert payloads == [f"m{i}".encode() for i in range(5)]
    sub.disconnect()
    # clean session discards it (MQTT-3.1.2-6) and says so (MQTT-3.2.2-1)
    clean = RawClient(bridge.port)
    assert clean.connect("keeper", clean_session=True).session_present is False


def test_unacknowledged_messages_are_resent_with_dup_on_reconnect_MQTT_4_4_0_1(bridge):
    sub = RawClient(bridge.port)
    sub.connect("forgetful", clean_session=False)
    sub.subscribe("t", 1)
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("t", b"once", 1, packet_id=1)
    first = recv_publish(sub)
    assert first.dup is False
    sub.close()  # no PUBACK
    time.sleep(0.2)
    sub = RawClient(bridge.port)
    sub.connect("forgetful", clean_session=False)
    again = recv_publish(sub)
    assert (again.payload, again.dup, again.packet_id) == (b"once", True, first.packet_id)
    sub.send(Puback(again.packet_id))
    assert_nothing(sub)


def test_qos2_publish_resent_with_dup_is_delivered_once(bridge):
    sub = RawClient(bridge.port)
    sub.connect("sub")
    sub.subscribe("x", 2)
    pub = RawClient(bridge.port)
    pub.connect("pub2", clean_session=False)
    pub.send(Publish("x", b"exactly-once", 2, packet_id=9))
    assert isinstance(pub.recv(), Pubrec)
    pub.send(Publish("x", b"exactly-once", 2, dup=True, packet_id=9))
    assert isinstance(pub.recv(), Pubrec)
    pub.send(Pubrel(9))
    assert isinstance(pub.recv(), Pubcomp)
    message = recv_publish(sub)
    sub.send(Pubrec(message.packet_id))
    assert isinstance(sub.recv(), Pubrel)
    sub.send(Pubcomp(message.packet_id))
    assert_nothing(sub)


def test_inflight_window_limits_unacknowledged_messages(bridge_factory):
    node = bridge_factory("max_inflight=5")
    sub = RawClient(node.port)
    sub.connect("slow-acker")
    sub.subscribe("w", 1)
    pub = RawClient(node.port)
    pub.connect("pub")
    for i in range(12):
        pub.publish("w", str(i).encode(), 1, packet_id=i + 1)
    first = [recv_publish(sub) for _ in range(5)]
    assert_nothing(sub)
    for message in first:
        sub.send(Puback(message.packet_id))
    rest = [recv_publish(sub) for _ in range(5)]
    assert [m.payload for m in first + rest] == [str(i).encode() for i in range(10)]


def test_offline_queue_limit_drops_oldest_and_logs_the_count(bridge_factory):
    node = bridge_factory("max_queued_messages=10")
    subscribe_then_go_offline(node.port, "bounded", "q", 1)
    pub = RawClient(node.port)
    pub.connect("pub")
    for i in range(40):
        pub.publish("q", str(i).encode(), 1, packet_id=i % 100 + 1)
    node.wait_for_log("dropped the")
    sub = RawClient(node.port)
    sub.connect("bounded", clean_session=False)
    received = [int(payload) for payload in drain_qos1(sub)]
    assert 1 <= len(received) <= 10
    assert received == sorted(received)
    assert received[-1] == 39  # the newest are kept


def test_persistent_session_expires_after_configured_time_offline(bridge_factory):
    node = bridge_factory("session_expiry_seconds=0.5")
    client = RawClient(node.port)
    client.connect("ephemeral", clean_session=False)
    client.subscribe("e", 1)
    client.disconnect()
    node.wait_for_log("session ephemeral expired", timeout=5)
    client = RawClient(node.port)
    assert client.connect("ephemeral", clean_session=False).session_present is False


def test_shared_subscription_delivers_each_message_to_one_member_round_robin(bridge):
    members = []
    for name in ("m1", "m2", "m3"):
        client = RawClient(bridge.port)
        client.connect(name)
        client.subscribe("$share/workers/jobs/+", 1)
        members.append(client)
    pub = RawClient(bridge.port)
    pub.connect("pub")
    for i in range(9):
        pub.publish(f"jobs/{i}", str(i).encode(), 1, packet_id=i + 1)
    counts = []
    seen = []
    for client in members:
        payloads = drain_qos1(client, idle=0.7)
        seen.extend(int(p) for p in payloads)
        counts.append(len(payloads))
    assert sorted(seen) == list(range(9))
    assert counts == [3, 3, 3]


def test_shared_member_leaving_hands_its_unacked_messages_to_another_member(bridge):
    greedy = RawClient(bridge.port)
    greedy.connect("greedy")
    greedy.subscribe("$share/g/work", 1)
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("work", b"job-1", 1, packet_id=1)
    assert recv_publish(greedy).payload == b"job-1"
    helper = RawClient(bridge.port)
    helper.connect("helper")
    helper.subscribe("$share/g/work", 1)
    greedy.close()  # leaves without PUBACK
    message = recv_publish(helper)
    assert message.payload == b"job-1"


def test_slow_consumer_is_cut_off_and_others_keep_being_served(bridge_factory):
    node = bridge_factory("write_buffer_high=65536", "slow_consumer_timeout=1")
    stuck = RawClient(node.port)
    stuck.connect("stuck")
    stuck.subscribe("flood", 0)
    stuck.sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
    healthy = RawClient(node.port)
    healthy.connect("healthy")
    healthy.subscribe("other", 0)
    pub = RawClient(node.port)
    pub.connect("flooder")
    payload = b"x" * 8000
    deadline = time.monotonic() + 20
    while "slow consumer" not in node.log_text() and time.monotonic() < deadline:
        for _ in range(50):
            pub.send(Publish("flood", payload, 0))
        time.sleep(0.02)
    node.wait_for_log("slow consumer")
    pub.publish("other", b"still here", 1, packet_id=1)
    assert recv_publish(healthy).payload == b"still here"


def test_mosquitto_pub_and_sub_interoperate(bridge):
    assert shutil.which("mosquitto_pub"), "mosquitto-clients missing: run `make test-deps`"
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(bridge.port),
            "-t",
            "interop/#",
            "-q",
            "1",
            "-C",
            "3",
            "-v",
            "-i",
            "mosq-sub",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        for i in range(3):
            subprocess.run(
                [
                    "mosquitto_pub",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(bridge.port),
                    "-t",
                    f"interop/{i}",
                    "-m",
                    f"hello {i}",
                    "-q",
                    str(i % 3),
                ],
                check=True,
                timeout=10,
            )
        out, _ = sub.communicate(timeout=10)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert out.splitlines() == [f"interop/{i} hello {i}" for i in range(3)]


def test_will_is_published_when_a_takeover_closes_the_old_connection(bridge):
    watcher = RawClient(bridge.port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 0)
    first = RawClient(bridge.port)
    first.connect("twin", will=Will("wills/twin", b"replaced", 0, False))
    second = RawClient(bridge.port)
    second.connect("twin")
    assert recv_publish(watcher).payload == b"replaced"
    first.expect_closed()


def test_orderly_shutdown_keeps_sessions_and_publishes_no_wills(bridge):
    sub = RawClient(bridge.port)
    sub.connect("survivor", clean_session=False, will=Will("wills/survivor", b"x", 1, True))
    sub.subscribe("keep/#", 1)
    bridge.stop()  # SIGTERM
    bridge.wait_for_log("stopped")
    bridge.start()
    pub = RawClient(bridge.port)
    pub.connect("pub")
    pub.publish("keep/1", b"after restart", 1, packet_id=1)
    watcher = RawClient(bridge.port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 1)
    assert_nothing(watcher)  # no retained will: the node shut down, the client did not fail
    sub = RawClient(bridge.port)
    assert sub.connect("survivor", clean_session=False).session_present is True
    assert recv_publish(sub).payload == b"after restart"


def test_messages_removed_by_retention_are_counted_and_logged_for_the_reader(bridge_factory):
    node = bridge_factory("segment_bytes=4096", "retention_bytes=16384")
    subscribe_then_go_offline(node.port, "late-reader", "bulk", 1)
    pub = RawClient(node.port)
    pub.connect("pub")
    for i in range(200):
        pub.publish("bulk", b"%05d" % i + b"." * 200, 1, packet_id=i % 100 + 1)
        if i == 150:
            time.sleep(1.2)  # retention runs at most once a second, after a commit
    sub = RawClient(node.port)
    sub.connect("late-reader", clean_session=False)
    received = [int(payload[:5]) for payload in drain_qos1(sub)]
    node.wait_for_log("removed by retention before delivery")
    assert received and received[-1] == 199
    assert received == sorted(received)
    assert len(received) < 200


def test_console_script_is_installed_and_answers_help():
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "mqtt-bridge"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "--listen HOST:PORT" in result.stdout


def test_offline_queue_byte_limit_drops_oldest(bridge_factory):
    node = bridge_factory("max_queued_bytes=4096")
    subscribe_then_go_offline(node.port, "small-budget", "b", 1)
    pub = RawClient(node.port)
    pub.connect("pub")
    for i in range(40):
        pub.publish("b", b"%03d" % i + b"x" * 500, 1, packet_id=i + 1)
    node.wait_for_log("dropped the")
    sub = RawClient(node.port)
    sub.connect("small-budget", clean_session=False)
    received = [int(p[:3]) for p in drain_qos1(sub)]
    assert 1 <= len(received) <= 8  # 8 x ~500 bytes fit in 4 KiB
    assert received[-1] == 39


def test_publisher_outrunning_the_store_is_paused_not_dropped(bridge_factory):
    node = bridge_factory("max_inbound_pending=4")
    sub = RawClient(node.port)
    sub.connect("sink")
    sub.subscribe("fast/#", 1)
    pub = RawClient(node.port)
    pub.connect("firehose")
    burst = b"".join(
        codec.encode(Publish(f"fast/{i % 5}", b"%04d" % i, 1, packet_id=i + 1)) for i in range(300)
    )
    pub.send_bytes(burst)  # 300 QoS 1 publishes without waiting for any PUBACK
    acked = set()
    while len(acked) < 300:
        ack = pub.recv()
        assert isinstance(ack, Puback)
        acked.add(ack.packet_id)
    assert acked == set(range(1, 301))
    assert len(drain_qos1(sub)) == 300


def test_session_expiry_counts_time_offline_across_a_restart(bridge_factory):
    node = bridge_factory("session_expiry_seconds=2")
    client = RawClient(node.port)
    client.connect("sleeper", clean_session=False)
    client.subscribe("s", 1)
    client.disconnect()
    time.sleep(0.5)  # the disconnect time is flushed with the offsets
    node.stop()
    time.sleep(2.0)  # offline longer than the expiry while the node is down
    node.start()
    node.wait_for_log("session sleeper expired", timeout=5)
    client = RawClient(node.port)
    assert client.connect("sleeper", clean_session=False).session_present is False
