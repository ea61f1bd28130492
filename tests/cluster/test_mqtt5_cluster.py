"""MQTT 5.0 across a cluster of real nodes (real Redis, real RocketMQ), used by paho v5 and
3.1.1 clients: metadata and Subscription Identifiers cross nodes at every QoS, the two versions
talk to each other across nodes, a take-over from another node says 0x8E, a session's expiry
interval is kept in the registry and enforced by whichever node holds it, and a delayed will is
not published when the session resumes on another node in time."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bridge.mqtt import codec
from bridge.mqtt.packets import Connect, Will
from bridge.mqtt.properties import PropertyId
from tests.support.clients import paho_client, stop_paho
from tests.support.cluster import ClusterLauncher
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


class V5:
    """A connected paho MQTT 5.0 client: its CONNACK, messages and disconnect reason."""

    def __init__(self, client: paho.Client) -> None:
        self.client = client
        self.connected = threading.Event()
        self.session_present: bool | None = None
        self.messages: queue.Queue[Any] = queue.Queue()
        self.disconnected = threading.Event()
        self.disconnect_reason: int | None = None

    def get(self, timeout: float = 10.0) -> Any:
        return self.messages.get(timeout=timeout)

    def none_within(self, seconds: float) -> bool:
        try:
            self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


@contextlib.contextmanager
def v5_client(
    port: int, client_id: str, *, clean_start: bool = True, expiry: int | None = None
) -> Iterator[V5]:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.reconnect_delay_set(60, 60)
    wrapper = V5(client)

    def on_connect(_c: Any, _u: Any, flags: Any, _rc: Any, _p: Any) -> None:
        wrapper.session_present = flags.session_present
        wrapper.connected.set()

    def on_disconnect(_c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        wrapper.disconnect_reason = rc.value
        wrapper.disconnected.set()

    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    client.on_message = lambda _c, _u, msg: wrapper.messages.put(msg)
    props = None
    if expiry is not None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry
    client.connect("127.0.0.1", port, 30, clean_start=clean_start, properties=props)
    client.loop_start()
    try:
        assert wrapper.connected.wait(10), "v5 client did not connect"
        yield wrapper
    finally:
        with contextlib.suppress(Exception):
            client.disconnect()
        stop_paho(client)


def subscribe_v5(sub: V5, topic_filter: str, qos: int, identifier: int = 0) -> None:
    props = None
    if identifier:
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = identifier
    done = threading.Event()
    sub.client.on_subscribe = lambda *_a: done.set()
    sub.client.subscribe(topic_filter, qos=qos, properties=props)
    assert done.wait(10), "no SUBACK"


def wait_routed(pub: paho.Client, sub: V5, prefix: str) -> None:
    """QoS 0 probes until one reaches `sub` (the filter reached the publishing node)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pub.publish(f"{prefix}/probe", "probe")
        try:
            sub.get(0.2)
        except queue.Empty:
            continue
        time.sleep(0.3)
        while not sub.messages.empty():
            sub.messages.get_nowait()
        return
    raise AssertionError("no probe reached the subscriber")


@pytest.fixture
def two_nodes(cluster: ClusterLauncher) -> tuple[BridgeProcess, BridgeProcess]:
    a = cluster.start("a")
    b = cluster.start("b")
    cluster.wait_linked()
    return a, b


def metadata() -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "resp/terminal-7"
    props.CorrelationData = b"\x00req-42"
    props.ContentType = "application/json"
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 120
    props.UserProperty = [("site", "berlin"), ("line", "1"), ("site", "hall-3")]
    return props


def test_v5_metadata_and_subscription_ids_cross_nodes_at_qos_0_1_2(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with v5_client(b.port, "v5-sub") as sub, v5_client(a.port, "v5-pub") as pub:
        subscribe_v5(sub, "req/#", 2, identifier=11)
        subscribe_v5(sub, "req/+", 1, identifier=12)
        wait_routed(pub.client, sub, "req")
        for qos in (0, 1, 2):
            info = pub.client.publish(f"req/q{qos}", f"m{qos}", qos=qos, properties=metadata())
            info.wait_for_publish(10)
        got = sorted((sub.get(), sub.get(), sub.get()), key=lambda m: m.topic)
        assert sub.none_within(0.5), "a message came twice"
    for qos, msg in enumerate(got):
        props = msg.properties
        assert (msg.topic, msg.payload, msg.qos) == (f"req/q{qos}", f"m{qos}".encode(), min(qos, 2))
        assert props.ResponseTopic == "resp/terminal-7"
        assert props.CorrelationData == b"\x00req-42"
        assert props.ContentType == "application/json"
        assert props.PayloadFormatIndicator == 1
        assert 0 < props.MessageExpiryInterval <= 120
        assert props.UserProperty == [("site", "berlin"), ("line", "1"), ("site", "hall-3")]
        assert sorted(props.SubscriptionIdentifier) == [11, 12]


def test_311_and_v5_clients_on_different_nodes_exchange_messages(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with paho_client(a.port) as old_sub, v5_client(b.port, "new-sub") as new_sub:
        old_sub.client.subscribe("mix/#", 1)
        subscribe_v5(new_sub, "mix/#", 1)
        with v5_client(b.port, "new-pub") as new_pub:
            wait_routed(new_pub.client, new_sub, "mix")
            deadline = time.monotonic() + 15
            while True:  # until the 3.1.1 subscriber on node a is routed too
                new_pub.client.publish("mix/probe", "probe")
                with contextlib.suppress(Exception):
                    old_sub.get(0.3)
                    break
                assert time.monotonic() < deadline
            time.sleep(0.3)
            for m in (old_sub.messages, new_sub.messages):
                while not m.empty():
                    m.get_nowait()
            new_pub.client.publish(
                "mix/v5", "from-v5", qos=1, properties=metadata()
            ).wait_for_publish(10)
        with paho_client(a.port) as old_pub:
            old_pub.client.publish("mix/v311", "from-v311", qos=1).wait_for_publish(10)
        old_got = sorted((old_sub.get(10), old_sub.get(10)), key=lambda m: m.topic)
        new_got = sorted((new_sub.get(10), new_sub.get(10)), key=lambda m: m.topic)
    assert [(m.topic, m.payload) for m in old_got] == [
        ("mix/v311", b"from-v311"),
        ("mix/v5", b"from-v5"),
    ]
    assert [(m.topic, m.payload) for m in new_got] == [
        ("mix/v311", b"from-v311"),
        ("mix/v5", b"from-v5"),
    ]
    assert new_got[1].properties.ResponseTopic == "resp/terminal-7"
    assert not hasattr(new_got[0].properties, "ResponseTopic")


def test_take_over_from_another_node_tells_the_old_v5_connection_0x8e(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with v5_client(a.port, "roamer5") as first, v5_client(b.port, "roamer5"):
        assert first.disconnected.wait(10), "the old connection was not closed"
    assert first.disconnect_reason == 0x8E


def test_session_expiry_lives_in_the_registry_and_is_enforced_on_the_node_holding_it(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with v5_client(a.port, "expiring", clean_start=True, expiry=4) as first:
        subscribe_v5(first, "exp/#", 1)
    with v5_client(b.port, "expiring", clean_start=False, expiry=4) as again:
        assert again.session_present is True
    time.sleep(5.5)  # offline past its interval, its session held by node b
    with v5_client(a.port, "expiring", clean_start=False, expiry=4) as late:
        assert late.session_present is False


def _connect_with_delayed_will(port: int, client_id: str, delay: int) -> socket.socket:
    """A raw v5 connection with a will delayed `delay` s and a session of 60 s."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    will = Will("wills/" + client_id, b"gone", 1, False, {PropertyId.WILL_DELAY_INTERVAL: delay})
    connect = Connect(
        client_id,
        clean_session=True,
        keepalive=30,
        will=will,
        protocol_level=5,
        properties={PropertyId.SESSION_EXPIRY_INTERVAL: 60},
    )
    sock.sendall(codec.encode(connect))
    decoder = codec.Decoder()
    decoder.protocol_level = 5
    while not (packets := decoder.packets()):
        decoder.feed(sock.recv(4096))
    assert packets[0].return_code == 0
    return sock


def test_delayed_will_waits_and_is_cancelled_by_resuming_on_another_node(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with v5_client(b.port, "will-watcher") as watcher:
        subscribe_v5(watcher, "wills/#", 1)
        with v5_client(a.port, "will-probe") as probe:
            wait_routed(probe.client, watcher, "wills")
        # A connection that drops and does not come back: its will comes after the delay.
        gone = _connect_with_delayed_will(a.port, "dev-gone", 2)
        dropped_at = time.monotonic()
        gone.close()
        msg = watcher.get(10)
        assert msg.topic == "wills/dev-gone"
        assert time.monotonic() - dropped_at >= 1.5
        # One that drops and resumes its session on node b within the delay: no will, ever.
        back = _connect_with_delayed_will(a.port, "dev-back", 3)
        back.close()
        with v5_client(b.port, "dev-back", clean_start=False, expiry=60):
            assert watcher.none_within(4.5), "the will was published though the session resumed"


def test_a_node_shutting_down_sends_its_v5_clients_to_another_node(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes  # linked: each knows the other from its heartbeat, MQTT address included
    captured: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with v5_client(a.port, "moving5") as client:
        client.client.on_disconnect = lambda _c, _u, _f, rc, props: captured.put((rc, props))
        a.stop()  # SIGTERM: an orderly shutdown
        reason, props = captured.get(timeout=10)
    assert reason.value == 0x8B
    assert props.ServerReference.endswith(f":{b.port}")
