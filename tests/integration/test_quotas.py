"""Quotas on what a client can make the server keep, on one real bridge process with small limits:
retained messages (per publisher and per node, by count and bytes), delayed publishes (bytes),
subscriptions per client, QoS 2 messages awaiting PUBREL, the will's size, and the topic levels.
Each refusal is checked at both protocol levels (docs/decisions.md, "Quotas"): a refused message
is never acknowledged as accepted, and each is counted in /metrics.

The node is shared by the module: each test uses its own ClientIds and topics, and clears the
retained messages it set (clearing is always allowed, which the tests use)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel, Subscription, Will
from bridge.mqtt.properties import PropertyId as P
from bridge.mqtt.reasons import ReasonCode as R
from tests.support.admin_http import TOKEN, AdminHttp
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5
from tests.support.processes import BridgeProcess, free_port
from tests.support.waiting import poll_until

pytestmark = pytest.mark.integration

SETTINGS = (
    "retained_max_messages=5",
    "retained_max_messages_per_client=2",
    "retained_max_bytes_per_client=300",
    "delayed_max_bytes_per_client=200",
    "max_subscriptions_per_client=3",
    "max_awaiting_rel=2",
    "max_will_bytes=100",
    "max_topic_levels=5",
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BridgeProcess, AdminHttp]]:
    """One node with small quotas and the admin API, for the whole module; killed at the end,
    and its log must hold no traceback."""
    admin_port = free_port()
    process = BridgeProcess(
        tmp_path_factory.mktemp("quotas") / "node",
        f"admin_listen=127.0.0.1:{admin_port}",
        f"admin_token={TOKEN}",
        *SETTINGS,
    )
    try:
        process.start()
        yield process, AdminHttp(admin_port)
    finally:
        process.kill()
    text = process.log_text()
    assert "Traceback" not in text, text[-4000:]


def counter(api: AdminHttp, name: str) -> float:
    """mqtt_bridge_<name>_total in /metrics (0 before it was first counted)."""
    status, text = api.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"mqtt_bridge_{name}_total":
                return sample.value
    return 0.0


def gauge(api: AdminHttp, name: str) -> float:
    """mqtt_bridge_<name> in /metrics."""
    status, text = api.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"mqtt_bridge_{name}":
                return sample.value
    raise AssertionError(f"mqtt_bridge_{name} not in /metrics")


def v5_client(port: int, client_id: str) -> RawClient5:
    client = RawClient5(port)
    assert client.connect(client_id).return_code == 0
    return client


def v311_client(port: int, client_id: str) -> RawClient:
    client = RawClient(port)
    assert client.connect(client_id).return_code == 0
    return client


def ack_of(client: RawClient, packet: Publish) -> Puback | Pubrec:
    """Send a QoS 1/2 PUBLISH and return its PUBACK/PUBREC."""
    client.send(packet)
    ack = client.recv()
    assert isinstance(ack, Puback | Pubrec) and ack.packet_id == packet.packet_id, ack
    return ack


def retain(client: RawClient, topic: str, payload: bytes, packet_id: int, qos: int = 1) -> int:
    """Publish a retained message; the reason code of its PUBACK/PUBREC (a PUBREC's handshake
    is completed)."""
    ack = ack_of(client, Publish(topic, payload, qos, True, packet_id=packet_id))
    if isinstance(ack, Pubrec) and ack.reason_code < 0x80:
        client.send(Pubrel(packet_id))
        assert isinstance(client.recv(), Pubcomp)
    return ack.reason_code


def retained_topics(port: int, client_id: str, topic_filter: str) -> set[str]:
    """The topics of the retained messages a new subscription to `topic_filter` receives."""
    client = v5_client(port, client_id)
    assert client.subscribe_many(Subscription(topic_filter, 0)) == [0]
    topics = set()
    while True:
        try:
            packet = client.recv(1.0)
        except TimeoutError:
            break
        assert isinstance(packet, Publish) and packet.retain, packet
        topics.add(packet.topic)
    client.disconnect()
    return topics


def clear(port: int, *topics: str) -> None:
    """Clear these topics' retained messages (always allowed)."""
    client = v5_client(port, "quota-cleaner")
    for i, topic in enumerate(topics, 1):
        assert retain(client, topic, b"", i) == 0
    client.disconnect()


# -- retained messages -------------------------------------------------------------------------


def test_a_v5_retained_publish_past_the_publishers_count_gets_0x97_and_is_not_kept(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, api = node
    before = counter(api, "quota_refused_retained")
    client = v5_client(bridge.port, "quota-r5")
    assert retain(client, "qr5/a", b"1", 1) == 0
    assert retain(client, "qr5/b", b"2", 2) == 0
    assert retain(client, "qr5/c", b"3", 3) == R.QUOTA_EXCEEDED
    assert retain(client, "qr5/c", b"3", 4, qos=2) == R.QUOTA_EXCEEDED
    assert retain(client, "qr5/a", b"replaced", 5) == 0  # replacing one's own: no more kept
    assert retain(client, "qr5/b", b"", 6) == 0  # clearing is always allowed
    assert retain(client, "qr5/c", b"3", 7) == 0  # and makes room
    client.disconnect()
    assert retained_topics(bridge.port, "quota-r5-reader", "qr5/#") == {"qr5/a", "qr5/c"}
    assert counter(api, "quota_refused_retained") == before + 2
    assert gauge(api, "retained_bytes") == len("qr5/areplaced") + len("qr5/c3")
    assert "retained_max_messages_per_client=2 reached by 'quota-r5'" in bridge.log_text()
    clear(bridge.port, "qr5/a", "qr5/c")


def test_a_v5_retained_qos0_publish_past_the_quota_is_answered_with_disconnect_0x97(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, _api = node
    client = v5_client(bridge.port, "quota-r0")
    assert retain(client, "qr0/a", b"1", 1) == 0
    assert retain(client, "qr0/b", b"2", 2) == 0
    client.send(Publish("qr0/c", b"3", 0, True))
    client.expect_disconnect(R.QUOTA_EXCEEDED)
    assert retained_topics(bridge.port, "quota-r0-reader", "qr0/#") == {"qr0/a", "qr0/b"}
    clear(bridge.port, "qr0/a", "qr0/b")


def test_a_311_retained_publish_past_the_quota_closes_the_connection_without_puback(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, _api = node
    client = v311_client(bridge.port, "quota-r3")
    client.publish("qr3/a", b"1", 1, packet_id=1, retain=True)
    client.publish("qr3/b", b"2", 1, packet_id=2, retain=True)
    client.send(Publish("qr3/c", b"3", 1, True, packet_id=3))
    with pytest.raises(ConnectionError):
        client.recv()  # closed, and no PUBACK came first: the message was not accepted
    assert retained_topics(bridge.port, "quota-r3-reader", "qr3/#") == {"qr3/a", "qr3/b"}
    clear(bridge.port, "qr3/a", "qr3/b")


def test_a_retained_message_past_the_publishers_bytes_is_refused(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, _api = node
    client = v5_client(bridge.port, "quota-rb")
    assert retain(client, "qrb/a", b"x" * 200, 1) == 0
    assert retain(client, "qrb/b", b"x" * 100, 2) == R.QUOTA_EXCEEDED  # 200+5 + 100+5 > 300
    assert retain(client, "qrb/a", b"x" * 290, 3) == 0  # the replaced one's bytes are freed
    client.disconnect()
    assert "retained_max_bytes_per_client=300 bytes" in bridge.log_text()
    clear(bridge.port, "qrb/a")


def test_the_nodes_retained_count_counts_every_publishers_messages(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, _api = node
    topics = []
    for n in range(2):
        client = v5_client(bridge.port, f"quota-rn{n}")
        for i in range(2):
            topics.append(f"qrn/{n}/{i}")
            assert retain(client, topics[-1], b"v", i + 1) == 0
        client.disconnect()
    client = v5_client(bridge.port, "quota-rn2")
    topics.append("qrn/2/0")
    assert retain(client, topics[-1], b"v", 1) == 0  # the node's fifth
    assert retain(client, "qrn/2/1", b"v", 2) == R.QUOTA_EXCEEDED
    client.disconnect()
    assert "retained_max_messages=5 reached" in bridge.log_text()
    clear(bridge.port, *topics)


# -- delayed publishes -------------------------------------------------------------------------


def test_delayed_publishes_past_the_clients_bytes_get_0x97_and_3_1_1_is_disconnected(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, api = node
    before = counter(api, "quota_refused_delayed")
    client = v5_client(bridge.port, "quota-d5")
    first = Publish("$delayed/600/qd/t", b"x" * 150, 1, packet_id=1)
    assert ack_of(client, first).reason_code == 0
    again = Publish("$delayed/600/qd/t", b"x" * 150, 1, packet_id=2)
    assert ack_of(client, again).reason_code == R.QUOTA_EXCEEDED
    client.disconnect()
    old = v311_client(bridge.port, "quota-d3")
    old.publish("$delayed/600/qd/t", b"x" * 150, 1, packet_id=1)
    old.send(Publish("$delayed/600/qd/t", b"x" * 150, 1, packet_id=2))
    with pytest.raises(ConnectionError):
        old.recv()
    assert counter(api, "quota_refused_delayed") == before + 2
    assert "delayed_max_bytes_per_client=200 bytes" in bridge.log_text()


# -- subscriptions -----------------------------------------------------------------------------


def test_filters_past_max_subscriptions_get_0x97_in_v5_and_0x80_in_311(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, api = node
    before = counter(api, "quota_refused_subscriptions")
    client = v5_client(bridge.port, "quota-s5")
    codes = client.subscribe_many(*(Subscription(f"qs/{i}", 1) for i in range(4)))
    assert codes == [1, 1, 1, R.QUOTA_EXCEEDED]
    # Subscribing again to a filter held replaces it: it does not count.
    assert client.subscribe_many(Subscription("qs/0", 0), packet_id=2) == [0]
    assert client.unsubscribe("qs/1", packet_id=3) == [0]
    assert client.subscribe_many(Subscription("qs/4", 1), packet_id=4) == [1]
    client.disconnect()
    old = v311_client(bridge.port, "quota-s3")
    for i in range(3):
        assert old.subscribe(f"qs/{i}", 1, packet_id=i + 1) == [1]
    assert old.subscribe("qs/3", 1, packet_id=4) == [0x80]
    old.disconnect()
    assert counter(api, "quota_refused_subscriptions") == before + 2
    assert "max_subscriptions_per_client=3 filters held already" in bridge.log_text()


# -- QoS 2 awaiting PUBREL ---------------------------------------------------------------------


def test_qos2_past_max_awaiting_rel_closes_311_and_v5_is_told_it_as_its_receive_maximum(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    """A v5 client that keeps to the Receive Maximum it was told is never refused for the
    quota: the CONNACK says max_awaiting_rel, and one beyond it is the client's protocol error
    (0x93). A 3.1.1 client has no Receive Maximum: one over the quota closes its connection."""
    bridge, api = node
    before = counter(api, "quota_refused_awaiting_rel")
    client = RawClient5(bridge.port)
    assert client.connect("quota-q5").properties[P.RECEIVE_MAXIMUM] == 2
    for packet_id in (1, 2):
        assert ack_of(client, Publish("qq/t", b"m", 2, packet_id=packet_id)).reason_code == 0
    # A resend of one held is answered as before, never refused.
    assert ack_of(client, Publish("qq/t", b"m", 2, dup=True, packet_id=1)).reason_code == 0
    client.send(Pubrel(1))
    assert isinstance(client.recv(), Pubcomp)
    assert ack_of(client, Publish("qq/t", b"m", 2, packet_id=3)).reason_code == 0
    client.send(Publish("qq/t", b"m", 2, packet_id=4))
    client.expect_disconnect(R.RECEIVE_MAXIMUM_EXCEEDED)
    old = v311_client(bridge.port, "quota-q3")
    for packet_id in (1, 2):
        ack_of(old, Publish("qq/t", b"m", 2, packet_id=packet_id))
    old.send(Publish("qq/t", b"m", 2, packet_id=3))
    with pytest.raises(ConnectionError):
        old.recv()
    assert counter(api, "quota_refused_awaiting_rel") == before + 1
    assert "max_awaiting_rel=2 QoS 2 messages await PUBREL already" in bridge.log_text()


# -- wills -------------------------------------------------------------------------------------


def test_a_will_larger_than_max_will_bytes_is_refused_at_connect_in_both_versions(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, api = node
    before = counter(api, "quota_refused_will")
    fits = Will("qw/t", b"w" * 100)
    too_large = Will("qw/t", b"w" * 101)
    client = RawClient5(bridge.port)
    assert client.connect("quota-w5", will=too_large).return_code == R.QUOTA_EXCEEDED
    client.expect_closed()
    client = RawClient(bridge.port)
    assert client.connect("quota-w3", will=too_large).return_code == 3
    client.expect_closed()
    assert RawClient5(bridge.port).connect("quota-w5", will=fits).return_code == 0
    assert counter(api, "quota_refused_will") == before + 2
    assert "will payload of 101 bytes exceeds max_will_bytes=100" in bridge.log_text()


# -- topic levels ------------------------------------------------------------------------------


def test_max_topic_levels_holds_for_publish_subscribe_and_will_topics(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, _api = node
    deep = "ql/1/2/3/4/5"  # six levels, max_topic_levels=5
    client = v5_client(bridge.port, "quota-l5")
    assert client.subscribe_many(Subscription(deep, 1)) == [R.TOPIC_FILTER_INVALID]
    client.send(Publish(deep, b"x", 1, packet_id=2))
    client.expect_disconnect(R.TOPIC_NAME_INVALID)
    old = v311_client(bridge.port, "quota-l3")
    assert old.subscribe(deep, 1) == [0x80]
    old.send(Publish(deep, b"x", 1, packet_id=2))
    with pytest.raises(ConnectionError):
        old.recv()
    will = Will(deep, b"w")
    assert RawClient5(bridge.port).connect("quota-lw5", will=will).return_code == (
        R.TOPIC_NAME_INVALID
    )
    assert RawClient(bridge.port).connect("quota-lw3", will=will).return_code != 0


# -- retained messages on SUBSCRIBE ------------------------------------------------------------


def test_repeated_subscribes_do_not_store_unsent_retained_copies_again(
    node: tuple[BridgeProcess, AdminHttp],
) -> None:
    bridge, api = node
    topics = ["qc/a", "qc/b", "qc/c"]
    first = v5_client(bridge.port, "quota-c-pub1")
    assert retain(first, topics[0], b"1", 1) == 0
    assert retain(first, topics[1], b"2", 2) == 0
    first.disconnect()
    second = v5_client(bridge.port, "quota-c-pub2")
    assert retain(second, topics[2], b"3", 1) == 0
    second.disconnect()
    stored_before = counter(api, "retained_copies_stored")
    unchanged_before = counter(api, "retained_copies_unchanged")
    reader = RawClient5(bridge.port)
    connack = reader.connect("quota-c-reader", properties={P.RECEIVE_MAXIMUM: 1})
    assert connack.return_code == 0
    assert reader.subscribe_many(Subscription("qc/#", 1)) == [1]
    held = reader.recv_publish()  # one in flight (Receive Maximum 1), not acknowledged yet
    for packet_id in range(2, 7):
        assert reader.subscribe_many(Subscription("qc/#", 1), packet_id=packet_id) == [1]
    # Three copies for the first SUBSCRIBE, one more for the message already sent; the five
    # later SUBSCRIBEs found the others still waiting unsent (2 + 4 x 3 of them). A SUBSCRIBE
    # queues its copies after its SUBACK, each once the store has it: wait for all 14.
    poll_until(lambda: counter(api, "retained_copies_unchanged") >= unchanged_before + 14, 10)
    assert counter(api, "retained_copies_unchanged") == unchanged_before + 14
    assert counter(api, "retained_copies_stored") == stored_before + 4
    reader.acknowledge(held)
    received = [held.topic]
    for _ in range(3):
        message = reader.recv_publish()
        assert message.retain
        reader.acknowledge(message)
        received.append(message.topic)
    reader.assert_nothing()
    assert sorted(received) == sorted([held.topic, *topics])
    reader.disconnect()
    clear(bridge.port, *topics)
