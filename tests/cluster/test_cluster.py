"""Several bridge processes as one cluster, with a real Redis and a real RocketMQ, used by real
MQTT clients: cross-node publish/subscribe, shared subscriptions across nodes, ClientId takeover
and races, retained messages and persistent sessions that move between nodes, targeted
forwarding (frames counted on the wire), a peer link cut and healed, SO_REUSEPORT, and notify
running on its own."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.clients import paho_client, stop_paho
from tests.support.cluster import ClusterLauncher, wait_for_route
from tests.support.processes import BridgeProcess, free_port
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ
from tests.support.rocketmq_use import admin_send
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


@pytest.fixture
def two_nodes(cluster: ClusterLauncher) -> tuple[BridgeProcess, BridgeProcess]:
    a = cluster.start("a")
    b = cluster.start("b")
    cluster.wait_linked()
    return a, b


def publish(port: int, topic: str, payload: str, qos: int = 0, retain: bool = False) -> None:
    with paho_client(port) as pub:
        pub.client.publish(topic, payload, qos=qos, retain=retain).wait_for_publish(10)


def test_wildcard_subscriber_on_one_node_gets_qos0_1_2_published_on_another(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with paho_client(b.port) as sub, paho_client(a.port) as pub:
        sub.client.subscribe([("factory/+/temp", 2), ("factory/#", 1)])
        wait_for_route(lambda p: pub.client.publish("factory/probe", p), sub)
        for qos in (0, 1, 2):
            pub.client.publish(f"factory/line{qos}/temp", f"m{qos}", qos=qos).wait_for_publish(10)
        got = sub.drain(3, timeout=15)
        time.sleep(0.5)  # nothing more may come
        got += sub.drain(3, timeout=0.1)
    # Each message matches both filters and is delivered once, at the larger granted QoS.
    assert sorted((m.payload.decode(), m.qos) for m in got) == [("m0", 0), ("m1", 1), ("m2", 2)]


def test_publish_is_forwarded_only_to_peers_with_matching_subscribers(
    cluster: ClusterLauncher,
) -> None:
    a = cluster.start("a")
    # b and c are reached through counting proxies (a, the smallest id, dials them).
    proxies = {}
    for node_id in ("b", "c"):
        peer_port = cluster.peer_ports[node_id] = free_port()
        proxy = TcpProxy(peer_port).start()
        proxies[node_id] = proxy
        cluster.start(node_id, f"peer_advertise=127.0.0.1:{proxy.port}")
    try:
        cluster.wait_linked()
        b, c = cluster.nodes["b"], cluster.nodes["c"]
        with paho_client(b.port) as sub, paho_client(a.port) as pub:
            sub.client.subscribe("only/b/#", 0)
            wait_for_route(lambda p: pub.client.publish("only/b/probe", p), sub)
            before = {n: p.count("Forward") for n, p in proxies.items()}
            for i in range(50):
                pub.client.publish(f"only/b/{i}", str(i), qos=0)
            assert len(sub.drain(50, timeout=15)) == 50
            for i in range(20):
                pub.client.publish(f"nobody/{i}", str(i), qos=0)
            time.sleep(0.5)
        forwarded = {n: p.count("Forward") - before[n] for n, p in proxies.items()}
        assert forwarded == {"b": 50, "c": 0}, forwarded
        assert c.proc is not None and c.proc.poll() is None
    finally:
        for proxy in proxies.values():
            proxy.stop()


def test_shared_subscription_spans_nodes_and_each_message_goes_to_one_member(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    count = 60
    with (
        paho_client(a.port) as member_a,
        paho_client(b.port) as member_b,
        paho_client(a.port) as probe_sub,
        paho_client(b.port) as pub,
    ):
        member_a.client.subscribe("$share/workers/jobs/#", 1)
        member_b.client.subscribe("$share/workers/jobs/#", 1)
        probe_sub.client.subscribe("jobs/#", 0)
        wait_for_route(lambda p: pub.client.publish("jobs/probe", p), probe_sub)
        time.sleep(0.5)  # member_a's membership travels with its filter's announcement
        for i in range(count):
            pub.client.publish(f"jobs/{i}", str(i), qos=1).wait_for_publish(10)
        got_a = member_a.drain(count, timeout=5)
        got_b = member_b.drain(count, timeout=5)
    payloads = [m.payload.decode() for m in got_a + got_b if not m.payload.startswith(b"probe")]
    assert sorted(payloads, key=int) == [str(i) for i in range(count)]
    assert len([m for m in got_a if not m.payload.startswith(b"probe")]) > 0
    assert len([m for m in got_b if not m.payload.startswith(b"probe")]) > 0


def test_connecting_on_another_node_takes_the_client_over(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    lost = threading.Event()
    with paho_client(a.port, client_id="roamer") as first:
        first.client.on_disconnect = lambda *_args: lost.set()
        with paho_client(b.port, client_id="roamer") as second:
            assert lost.wait(10), "the old connection on node a was not closed"
            second.client.subscribe("roam/#", 1)
            with paho_client(a.port) as pub:
                wait_for_route(lambda p: pub.client.publish("roam/probe", p), second)
                pub.client.publish("roam/x", "hello", qos=1).wait_for_publish(10)
            assert second.get(10).payload == b"hello"
    assert "taken over by a connection on another node" in a.log_text()


def _race_once(ports: tuple[int, int], client_id: str) -> list[bool]:
    """Connect the same ClientId to both nodes at the same moment; which ones stay connected."""
    clients = []
    for _port in ports:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True)
        client.reconnect_delay_set(60, 60)  # no reconnect during the test
        clients.append(client)
    start = threading.Barrier(2)

    def go(client: paho.Client, port: int) -> None:
        start.wait()
        client.connect("127.0.0.1", port, 30)
        client.loop_start()

    threads = [
        threading.Thread(target=go, args=(c, p)) for c, p in zip(clients, ports, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    time.sleep(2.0)  # the loser's node closes it within the takeover
    alive = [c.is_connected() for c in clients]
    for c in clients:
        c.disconnect()
        stop_paho(c)
    return alive


def test_same_client_id_racing_on_two_nodes_ends_with_exactly_one_connected(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    outcomes = [_race_once((a.port, b.port), f"racer-{i}") for i in range(8)]
    assert all(sum(alive) == 1 for alive in outcomes), outcomes


def test_retained_message_set_on_one_node_is_delivered_on_another(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    publish(a.port, "status/press7", "RUNNING", qos=1, retain=True)
    deadline = time.monotonic() + 10
    while True:
        with paho_client(b.port) as sub:
            sub.client.subscribe("status/+", 1)
            try:
                msg = sub.get(2)
                break
            except Exception:
                assert time.monotonic() < deadline, "retained message never reached node b"
    assert (msg.topic, msg.payload, msg.retain) == ("status/press7", b"RUNNING", True)


def test_persistent_session_moves_nodes_with_its_subscriptions_and_offline_messages(
    two_nodes: tuple[BridgeProcess, BridgeProcess],
) -> None:
    a, b = two_nodes
    with paho_client(a.port, client_id="terminal-42", clean_session=False) as term:
        term.client.subscribe("pay/store/42/#", 1)
        with paho_client(b.port) as pub:
            wait_for_route(lambda p: pub.client.publish("pay/store/42/probe", p), term)
    for i in range(5):
        publish(b.port, f"pay/store/42/order/{i}", f"paid-{i}", qos=1)
    with paho_client(b.port, client_id="terminal-42", clean_session=False) as term:
        got = term.drain(5, timeout=15)
    assert [m.payload.decode() for m in got] == [f"paid-{i}" for i in range(5)]


def test_cut_peer_link_heals_and_subscriptions_made_meanwhile_converge(
    cluster: ClusterLauncher,
) -> None:
    a = cluster.start("a")
    peer_port = cluster.peer_ports["b"] = free_port()
    proxy = TcpProxy(peer_port).start()
    try:
        b = cluster.start("b", f"peer_advertise=127.0.0.1:{proxy.port}")
        cluster.wait_linked()
        proxy.cut()
        a.wait_for_log("peer link to b lost", 10)
        with paho_client(b.port) as sub, paho_client(a.port) as pub:
            sub.client.subscribe("made/during/cut", 1)
            time.sleep(1.0)
            proxy.heal()
            # After the link is back, b's replay tells a about the new subscription.
            wait_for_route(lambda p: pub.client.publish("made/during/cut", p), sub, timeout=30)
            pub.client.publish("made/during/cut", "after-heal", qos=1).wait_for_publish(10)
            assert sub.get(10).payload == b"after-heal"
    finally:
        proxy.stop()


def test_two_node_processes_share_one_port_with_reuse_port_each_a_cluster_member(
    cluster: ClusterLauncher,
) -> None:
    port = free_port()
    a = cluster.start("a", "reuse_port=true", port=port)
    b = cluster.start("b", "reuse_port=true", port=port)
    cluster.wait_linked()
    # The kernel spreads connections over both processes; whichever took each client, a
    # publish reaches every subscriber.
    with contextlib.ExitStack() as stack:
        subs = [stack.enter_context(paho_client(port)) for _ in range(16)]
        for sub in subs:
            sub.client.subscribe("shared/port/#", 0)
        with paho_client(port) as pub:
            for sub in subs:
                wait_for_route(lambda p: pub.client.publish("shared/port/probe", p), sub)
            pub.client.publish("shared/port/x", "hello", qos=1).wait_for_publish(10)
            for sub in subs:  # probes for later subscribers came too: skip them
                while (msg := sub.get(10)).payload.startswith(b"probe-"):
                    pass
                assert msg.payload == b"hello"
    served = ["connected from" in n.log_text() for n in (a, b)]
    assert all(served), "one process took every connection"


def test_standalone_notify_routes_backend_messages_and_tells_only_nodes_with_readers(
    cluster: ClusterLauncher, rocketmq: LocalRocketMQ | ExternalRocketMQ, tmp_path: Path
) -> None:
    """Nodes run with notify=false; `python -m notify` (the smallest id, so it dials every node:
    its link to node c passes a counting proxy) routes a message a backend produced with
    RocketMQ's admin tool to the subscriber on node b, and tells node c nothing."""
    a = cluster.start("a", "notify=false")
    b = cluster.start("b", "notify=false")
    c_peer = cluster.peer_ports["c"] = free_port()
    proxy = TcpProxy(c_peer).start()
    try:
        cluster.start("c", "notify=false", f"peer_advertise=127.0.0.1:{proxy.port}")
        notifier = cluster.start_notify("0notify", tmp_path / "notify")
        cluster.wait_linked()
        for node_id in ("a", "b", "c"):
            notifier.wait_for_log(f"peer link to {node_id} up")
        topic = f"pay{cluster.name}"
        with paho_client(b.port, "terminal-42") as term, paho_client(a.port) as pub:
            term.client.subscribe(f"{topic}/store/42/#", 1)
            wait_for_route(lambda p: pub.client.publish(f"{topic}/store/42/probe", p), term)
            time.sleep(1.0)  # the subscription reaches notify too (it has no MQTT to probe)
            # Sent twice (after mqadmin's own timeout), the second copy would go unread.
            admin_send(rocketmq, "-t", topic, "-c", f"{topic}/store/42/order/9", "-p", "paid")
            msg = term.get(30)
        assert (msg.topic, msg.payload, msg.qos) == (f"{topic}/store/42/order/9", b"paid", 1)
        assert proxy.count("Grew") == 0 and proxy.count("Wake") == 0
    finally:
        proxy.stop()


def test_a_node_that_joins_routes_its_first_publish_to_the_subscribers_of_other_nodes(
    two_nodes: tuple[BridgeProcess, BridgeProcess], cluster: ClusterLauncher
) -> None:
    """A new node takes clients only once every alive member has replayed its interest to it:
    a QoS 1 message published the moment its port opens reaches a subscriber on another node
    (before, it was stored on no queue and PUBACKed: lost)."""
    a, _b = two_nodes
    with paho_client(a.port, client_id="early-watch", clean_session=False) as sub:
        sub.client.subscribe("early/#", 1)
    c = cluster.start("c")  # returns once c's MQTT port accepts
    publish(c.port, "early/first", "first", qos=1)
    assert "no interest from" not in c.log_text()
    with paho_client(a.port, client_id="early-watch", clean_session=False) as sub:
        got = sub.drain(1, timeout=15)
    assert [m.payload.decode() for m in got] == ["first"]


def test_a_session_moving_between_nodes_misses_nothing_published_on_the_node_it_left(
    cluster: ClusterLauncher,
) -> None:
    """The node that hands a session over keeps routing to its filters until the new owner has
    announced them; a publisher on that node loses nothing while the session moves back and
    forth. The peer link is slow (0.2 s each way), as between two racks under load."""
    # A round trip of 0.4 s is near the default interest_confirm_timeout: give the SUBSCRIBE's
    # confirmation room, as an operator of such a link would.
    a = cluster.start("a", "interest_confirm_timeout=2")
    proxy = TcpProxy(cluster.peer_ports.setdefault("b", free_port()), delay=0.2).start()
    try:
        b = cluster.start("b", f"peer_advertise=127.0.0.1:{proxy.port}")
        cluster.wait_linked()
        _move_a_session_to_and_fro(a, b)
    finally:
        proxy.stop()


def _move_a_session_to_and_fro(a: BridgeProcess, b: BridgeProcess) -> None:
    with paho_client(a.port, client_id="mover", clean_session=False) as sub:
        sub.client.subscribe("move/#", 1)
        with paho_client(b.port) as pub:
            wait_for_route(lambda p: pub.client.publish("move/probe", p), sub)
    stop = threading.Event()
    sent: list[str] = []  # PUBACKed
    attempted: list[str] = []  # published, acknowledged or not

    def publish_on_a() -> None:
        with paho_client(a.port, client_id="move-pub") as pub:
            deadline = time.monotonic() + 60
            while not stop.is_set() and len(sent) < 50_000 and time.monotonic() < deadline:
                batch = [f"m{len(sent) + i}" for i in range(20)]  # 20 in flight, as users do
                attempted.extend(batch)
                infos = [pub.client.publish("move/x", p, qos=1) for p in batch]
                for info in infos:
                    info.wait_for_publish(10)
                sent.extend(batch)

    publisher = threading.Thread(target=publish_on_a, daemon=True)
    publisher.start()
    received: set[str] = set()
    try:
        for node in (b, a, b, a, b):  # each connect takes the session over from the other node
            with paho_client(node.port, client_id="mover", clean_session=False) as sub:
                received.update(m.payload.decode() for m in sub.drain(30, timeout=10))
            # paho acknowledged everything it queued, drained or not: count it all.
            while not sub.messages.empty():
                received.add(sub.messages.get_nowait().payload.decode())
    finally:
        stop.set()
        publisher.join(30)
    with paho_client(a.port, client_id="mover", clean_session=False) as sub:
        deadline = time.monotonic() + 30
        while not set(sent) <= received and time.monotonic() < deadline:
            for message in sub.drain(1, timeout=1):
                received.add(message.payload.decode())
    probes = {p for p in received if p.startswith("probe")}
    assert len(sent) > 100
    missing = set(sent) - received
    assert not missing, f"{len(missing)} of {len(sent)} PUBACKed lost: {sorted(missing)[:5]}"
    assert received - probes <= set(attempted)
