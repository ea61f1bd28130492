"""A SUBACK means the cluster knows the filter: a PUBLISH that reaches any node after the
subscriber's SUBACK is routed to it, and a peer that does not confirm in time is handled as a
lost link instead of holding the SUBACK.

The peer link between the two nodes goes through a proxy that delays every byte by 50 ms (a
slow network between racks), so without the confirmation a publisher on the other node always
wins the race against the filter's announcement."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import Puback, Publish, Suback, Subscribe, Subscription
from tests.support.clients import RawClient
from tests.support.cluster import ClusterLauncher
from tests.support.processes import BridgeProcess, free_port
from tests.support.redis import LocalRedis
from tests.support.rocketmq import LocalRocketMQ
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

ROUNDS = 20


def test_a_publish_on_another_node_right_after_the_suback_reaches_the_new_subscriber(
    cluster: ClusterLauncher,
) -> None:
    a = cluster.start("a")
    proxy = TcpProxy(cluster.peer_ports.setdefault("b", free_port()), delay=0.05).start()
    sub = pub = None
    try:
        b = cluster.start("b", f"peer_advertise=127.0.0.1:{proxy.port}")
        cluster.wait_linked()
        sub, pub = RawClient(a.port, timeout=10), RawClient(b.port, timeout=10)
        assert sub.connect("race-sub").return_code == 0
        assert pub.connect("race-pub").return_code == 0
        run = uuid.uuid4().hex[:8]
        missed = []
        for i in range(1, ROUNDS + 1):
            topic = f"race/{run}/{i}"
            sub.send(Subscribe(i, [Subscription(topic, 1)]))
            suback = sub.recv()
            assert isinstance(suback, Suback) and list(suback.return_codes) == [1], suback
            pub.publish(topic, f"m{i}".encode(), qos=1, packet_id=i)  # at once: no probe, no sleep
            try:
                got = sub.recv(5)
            except TimeoutError:
                missed.append(i)
                continue
            assert isinstance(got, Publish) and got.payload == f"m{i}".encode(), got
            sub.send(Puback(got.packet_id or 0))
        assert not missed, f"{len(missed)} of {ROUNDS} messages published after the SUBACK lost"
    finally:
        for client in (sub, pub):
            if client is not None:
                client.close()
        proxy.stop()


def test_a_message_another_node_stores_while_the_new_filter_travels_there_reaches_the_subscriber(
    bridge_factory: Callable[..., BridgeProcess], redis_server: LocalRedis, tmp_path: Path
) -> None:
    """Client `reader` on b already reads topic T, so b stores what is published on T. `sub`
    subscribes to T on a: a reads where T's queue ends, then announces the filter over a link
    that takes 0.3 s. A message b stores meanwhile is after `sub`'s start, but b announces it
    to the readers it knows, not to a. Twice: stored before the filter reached b (b tells a
    the queue's end when the filter arrives), and still being stored when it arrives (the
    broker frozen meanwhile: once stored it is announced to the readers the queue has then).
    The broker it freezes is its own, not the one other tests share."""
    mq = LocalRocketMQ(tmp_path / "rocketmq", timer=False).start()
    cluster = ClusterLauncher(
        bridge_factory, mq.namesrv_addr, tuple(redis_server.bridge_settings())
    )
    proxy: TcpProxy | None = None
    clients: list[RawClient] = []
    broker = mq.pid("broker")
    frozen = False
    try:
        assert broker is not None
        a = cluster.start("a", "interest_confirm_timeout=3")
        proxy = TcpProxy(cluster.peer_ports.setdefault("b", free_port()), delay=0.3).start()
        b = cluster.start(
            "b", f"peer_advertise=127.0.0.1:{proxy.port}", "interest_confirm_timeout=3"
        )
        cluster.wait_linked()
        reader, pub, sub = (RawClient(n.port, timeout=10) for n in (b, b, a))
        clients += [reader, pub, sub]
        run = uuid.uuid4().hex[:8]
        for client, name in ((reader, "reader"), (pub, "pub"), (sub, "sub")):
            assert client.connect(f"travel-{name}-{run}").return_code == 0
        for i, in_flight in enumerate((False, True), start=1):
            topic = f"travel/{run}/{i}"
            assert reader.subscribe(topic, 1, packet_id=i) == [1]
            sub.send(Subscribe(i, [Subscription(topic, 1)]))
            time.sleep(0.1)  # a has read the queue's end; its filter reaches b at 0.3 s
            if in_flight:
                os.kill(broker, signal.SIGSTOP)
                frozen = True
                pub.send(Publish(topic, b"in flight", 1, False, packet_id=i))
                time.sleep(0.5)  # the filter reaches b while the message waits on the broker
                os.kill(broker, signal.SIGCONT)
                frozen = False
                ack = pub.recv()
                assert isinstance(ack, Puback) and ack.packet_id == i, ack
            else:
                pub.publish(topic, b"stored", qos=1, packet_id=i)
            got = reader.recv()
            assert isinstance(got, Publish), got
            reader.send(Puback(got.packet_id or 0))
            # The message may come before the SUBACK (MQTT 3.1.1 3.8.4 allows it): it is
            # woken by b's answer to the filter, which precedes b's confirmation.
            first, second = sub.recv(5), sub.recv(5)
            suback, got = (first, second) if isinstance(first, Suback) else (second, first)
            assert isinstance(suback, Suback) and list(suback.return_codes) == [1], suback
            assert isinstance(got, Publish) and got.topic == topic, got
            sub.send(Puback(got.packet_id or 0))
        # Not by the re-read of every queue end that follows a lost link:
        assert a.log_text().count("peer link to b up") == 1, a.log_text()
    finally:
        if frozen and broker is not None:
            os.kill(broker, signal.SIGCONT)
        for client in clients:
            client.close()
        if proxy is not None:
            proxy.stop()
        cluster.stop_all()
        mq.stop(graceful=False)


def test_a_peer_that_does_not_confirm_delays_the_suback_only_until_its_link_is_dropped(
    cluster: ClusterLauncher,
) -> None:
    """Node b is frozen (SIGSTOP) while a client subscribes on a: the SUBACK still comes (after
    `interest_confirm_timeout`), a drops its link to b as lost, and once b runs again the link
    comes back with a replay: a publish on b then reaches the subscriber."""
    a = cluster.start("a", "interest_confirm_timeout=0.5")
    b = cluster.start("b")
    cluster.wait_linked()
    sub = pub = None
    stopped = False
    try:
        sub = RawClient(a.port, timeout=10)
        assert sub.connect("frozen-peer-sub").return_code == 0
        os.kill(b.pid, signal.SIGSTOP)
        stopped = True
        sub.send(Subscribe(1, [Subscription("frozen/x", 1)]))
        suback = sub.recv(2.5)  # under node_timeout (3 s): b is not judged dead meanwhile
        assert isinstance(suback, Suback) and list(suback.return_codes) == [1], suback
        os.kill(b.pid, signal.SIGCONT)
        stopped = False
        a.wait_for_log("peer link to b closed: did not confirm interest", 5)
        deadline = time.monotonic() + 20
        while a.log_text().count("peer link to b up") < 2:
            assert time.monotonic() < deadline, "the link to b did not come back"
            time.sleep(0.05)
        b.wait_for_log("peer a: 1 filters", 10)  # a's replay after the new link
        pub = RawClient(b.port, timeout=10)
        assert pub.connect("frozen-peer-pub").return_code == 0
        pub.publish("frozen/x", b"after", qos=1, packet_id=1)
        got = sub.recv(10)
        assert isinstance(got, Publish) and got.payload == b"after", got
    finally:
        if stopped:
            os.kill(b.pid, signal.SIGCONT)
        for client in (sub, pub):
            if client is not None:
                client.close()
