"""Faults of a cluster under QoS 1 load: kill -9 of one of three nodes behind HAProxy (also with
Redis and RocketMQ behind credentials and TLS), a restart of Redis, and a Sentinel failover of
the Redis master. The clients reconnect as the spec asks (persistent sessions, resending what
was not acknowledged), and the tests count: every PUBACKed message reaches the persistent
subscriber, and the wills of the dead node's clients are published exactly once (none for the
others). Counts are printed (`pytest -s`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import Will
from tests.support.certs import make_tls_files
from tests.support.clients import RawClient, paho_client
from tests.support.cluster import ClusterLauncher, wait_for_route
from tests.support.haproxy import LocalHAProxy
from tests.support.load import Qos1Publisher, Qos1Subscriber
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalRedis, LocalSentinelRedis, RedisAuth, connect
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ
from tests.support.waiting import poll_until, wait_until

pytestmark = [pytest.mark.fault, pytest.mark.rocketmq, pytest.mark.timeout(300)]

DELIVERY_TIMEOUT = 90.0


def _subscribe_everywhere(nodes: list[BridgeProcess], client_id: str, topic_filter: str) -> None:
    """Create the persistent subscription and wait until every node routes to it."""
    with paho_client(nodes[0].port, client_id=client_id, clean_session=False) as sub:
        sub.client.subscribe(topic_filter, 1)
        probe_topic = topic_filter.replace("#", "probe").replace("+", "probe")
        for node in nodes:
            with paho_client(node.port) as pub:
                wait_for_route(lambda p, c=pub: c.client.publish(probe_topic, p), sub)


def _run_load(
    port: int, fault: Callable[[], None], publishers: int = 3, before: int = 150, after: int = 150
) -> tuple[list[Qos1Publisher], set[str]]:
    """Publish QoS 1 from `publishers` clients through `port`; inject `fault` after `before`
    PUBACKs; stop after `after` more. Returns the publishers and every PUBACKed payload."""
    stop = threading.Event()
    clients = [Qos1Publisher(port, f"pub{i}", stop) for i in range(publishers)]
    for client in clients:
        client.start()

    def acked() -> int:
        return sum(len(c.acks) for c in clients)

    try:
        wait_until(lambda: acked() >= before, 90, f"{before} PUBACKs before the fault")
        fault()
        at_fault = acked()
        wait_until(lambda: acked() >= at_fault + after, 120, f"{after} PUBACKs after the fault")
    finally:
        stop.set()
        for client in clients:
            client.join(150)
    for client in clients:
        assert client.error is None, f"{client.client_id}: {client.error!r}"
    pubacked = set().union(*(c.acked for c in clients))
    return clients, pubacked


def _assert_delivered(subscriber: Qos1Subscriber, pubacked: set[str], what: str) -> None:
    try:
        poll_until(lambda: pubacked <= set(subscriber.delivered), DELIVERY_TIMEOUT)
    finally:
        subscriber.stop.set()
        subscriber.join(10)
    delivered = {p for p in subscriber.delivered if not p.startswith("probe")}
    duplicates = sum(n - 1 for p, n in subscriber.delivered.items() if not p.startswith("probe"))
    print(
        f"\n{what}: PUBACKed {len(pubacked)}, delivered {len(delivered)} distinct, "
        f"duplicates {duplicates}, subscriber reconnects {subscriber.reconnects}"
    )
    lost = pubacked - delivered
    assert not lost, f"{len(lost)} PUBACKed messages lost, e.g. {sorted(lost)[:5]}"


def _two_nodes_and_a_keeper(
    cluster: ClusterLauncher,
) -> tuple[BridgeProcess, BridgeProcess, Qos1Subscriber]:
    """Nodes a and b linked, and a persistent QoS 1 subscriber of `load/#` on b, running."""
    a, b = cluster.start("a"), cluster.start("b")
    cluster.wait_linked()
    _subscribe_everywhere([b, a], "keeper", "load/#")
    keeper = Qos1Subscriber(b.port, "keeper")
    keeper.start()
    return a, b, keeper


@pytest.fixture
def cluster(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    redis_server: LocalRedis,
) -> ClusterLauncher:
    return ClusterLauncher(
        bridge_factory, rocketmq.namesrv_addr, tuple(redis_server.bridge_settings())
    )


def test_kill_9_of_one_of_three_nodes_behind_haproxy_loses_no_pubacked_message_and_publishes_each_will_once(  # noqa: E501
    cluster: ClusterLauncher, redis_server: LocalRedis, tmp_path: Path
) -> None:
    nodes = [cluster.start(n) for n in ("a", "b", "c")]
    cluster.wait_linked()
    lb = LocalHAProxy(tmp_path / "haproxy", None, [f"127.0.0.1:{n.port}" for n in nodes]).start()
    try:
        _subscribe_everywhere(nodes, "keeper", "load/#")
        _subscribe_everywhere(nodes, "will-watcher", "wills/#")
        keeper = Qos1Subscriber(lb.frontend_port, "keeper")
        watcher = Qos1Subscriber(lb.frontend_port, "will-watcher")
        keeper.start()
        watcher.start()
        # Idle clients with wills, spread over the nodes by the balancer; never reconnecting.
        will_clients = {}
        for i in range(9):
            client = RawClient(lb.frontend_port)
            client.connect(
                f"dev{i}",
                keepalive=0,
                will=Will(f"wills/dev{i}", f"will-dev{i}".encode(), 1, False),
            )
            will_clients[f"dev{i}"] = client
        registry = redis_server.client()
        owners = {cid: registry.hget(f"{cluster.name}:c:{cid}", "node") for cid in will_clients}
        victim_id = max(("a", "b", "c"), key=lambda n: list(owners.values()).count(n))
        victim = cluster.nodes[victim_id]
        doomed = {cid for cid, node in owners.items() if node == victim_id}
        assert doomed, owners
        # A client of the victim that disconnected cleanly: its will must never be published.
        polite = RawClient(victim.port)
        polite.connect("polite", keepalive=0, will=Will("wills/polite", b"will-polite", 1, False))
        polite.disconnect()

        killed_at: list[float] = []

        def kill_victim() -> None:
            victim.kill()
            killed_at.append(time.monotonic())

        _publishers, pubacked = _run_load(lb.frontend_port, kill_victim)
        _assert_delivered(keeper, pubacked, f"kill -9 of node {victim_id}")
        # Wills: the dead node's clients, once each; none of the clients on other nodes.
        expected = {f"will-{cid}" for cid in doomed}
        poll_until(lambda: expected <= set(watcher.delivered), 30)
        time.sleep(2.0)  # a second (wrong) publication would show by now
        watcher.stop.set()
        watcher.join(10)
        wills = {p: n for p, n in watcher.delivered.items() if not p.startswith("probe")}
        print(f"wills delivered {wills}, clients of the killed node {sorted(doomed)}")
        for client in will_clients.values():
            client.disconnect()
        assert set(wills) == expected
        assert all(n == 1 for n in wills.values()), wills
        survivors = [n for n in nodes if n is not victim]
        assert any(f"node {victim_id} is dead" in n.log_text() for n in survivors)

    finally:
        lb.stop()


def test_kill_9_of_a_node_with_redis_and_rocketmq_behind_credentials_and_tls_loses_no_pubacked_message(  # noqa: E501
    bridge_factory: Callable[..., BridgeProcess],
    secured_rocketmq: LocalRocketMQ,
    tmp_path: Path,
) -> None:
    """The kill -9 drill with every door locked: peer links prove the cluster secret, Redis
    speaks TLS only (client certificates required) to an ACL user, RocketMQ signs every request
    and speaks TLS only. Nothing PUBACKed is lost, and no secret reaches a node's log."""
    auth = RedisAuth(
        password=secrets.token_hex(16),
        username="mqtt-node",
        tls=make_tls_files(tmp_path / "redis-tls"),
    )
    with LocalRedis(tmp_path / "redis", auth=auth) as redis_server:
        cluster = ClusterLauncher(
            bridge_factory,
            secured_rocketmq.namesrv_addr,
            (
                *redis_server.bridge_settings(),
                *secured_rocketmq.node_settings(tmp_path / "rocketmq-secrets"),
            ),
        )
        nodes = [cluster.start(n) for n in ("a", "b", "c")]
        cluster.wait_linked()
        backends = [f"127.0.0.1:{n.port}" for n in nodes]
        lb = LocalHAProxy(tmp_path / "haproxy", None, backends).start()
        try:
            _subscribe_everywhere(nodes, "keeper", "load/#")
            keeper = Qos1Subscriber(lb.frontend_port, "keeper")
            keeper.start()
            killed: list[str] = []

            def kill_the_keepers_node() -> None:
                # The persistent subscriber's session must be taken over through the TLS
                # registry, and its messages read again from the signed TLS store.
                with redis_server.client() as registry:
                    victim_id = registry.hget(f"{cluster.name}:c:keeper", "node")
                cluster.nodes[victim_id].kill()
                killed.append(victim_id)

            _publishers, pubacked = _run_load(
                lb.frontend_port, kill_the_keepers_node, before=100, after=100
            )
            _assert_delivered(keeper, pubacked, f"secured cluster, kill -9 of node {killed[0]}")
            survivors = [n for node_id, n in cluster.nodes.items() if node_id != killed[0]]
            wait_until(
                lambda: any(f"node {killed[0]} is dead" in n.log_text() for n in survivors),
                30,
                "a survivor taking over the killed node's sessions",
            )
            for node in nodes:
                log = node.log_text()
                for secret in (auth.password, secured_rocketmq.acl_password, cluster.secret):
                    assert secret not in log
        finally:
            lb.stop()
            for node in nodes:  # before their Redis goes
                node.kill()


def test_redis_restart_under_load_loses_nothing_and_nodes_recover_without_help(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    tmp_path: Path,
) -> None:
    redis = LocalRedis(tmp_path / "redis").start()
    try:
        cluster = ClusterLauncher(
            bridge_factory, rocketmq.namesrv_addr, (f"redis_url={redis.url}",)
        )
        a, b, keeper = _two_nodes_and_a_keeper(cluster)

        def restart_redis() -> None:
            redis.kill()
            time.sleep(3.0)
            redis.restart()

        _publishers, pubacked = _run_load(a.port, restart_redis)
        _assert_delivered(keeper, pubacked, "Redis kill -9 and restart")
        # Both nodes work as a cluster again: new sessions register, no node was declared dead.
        with paho_client(b.port, client_id="after-restart") as sub, paho_client(a.port) as pub:
            assert sub.connack_rc[0] == 0, sub.connack_rc
            sub.client.subscribe("after/#", 1)
            wait_for_route(lambda p: pub.client.publish("after/x", p), sub)
        for node in (a, b):
            assert "is dead" not in node.log_text()
    finally:
        redis.stop()


def test_sentinel_failover_of_redis_master_under_load_loses_nothing_and_nodes_follow(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    tmp_path: Path,
) -> None:
    sentinel = LocalSentinelRedis(tmp_path / "sentinel").start()
    try:
        cluster = ClusterLauncher(
            bridge_factory,
            rocketmq.namesrv_addr,
            (
                f"redis_sentinels={','.join(sentinel.sentinels)}",
                f"redis_master_name={sentinel.master_name}",
                "redis_wait_replicas=1",
            ),
        )
        a, b, keeper = _two_nodes_and_a_keeper(cluster)
        old_master = sentinel.master_addr()
        _publishers, pubacked = _run_load(a.port, sentinel.failover)
        assert sentinel.master_addr() != old_master
        _assert_delivered(keeper, pubacked, "Sentinel failover")
        # Registrations reach the new master (a node's connection to the old one fails once
        # that is demoted, and it follows the Sentinels); none is acknowledged and then lost.
        new_master = connect(sentinel.master_addr())
        deadline = time.monotonic() + 30
        registered: list[str] = []
        while True:
            client_id = f"after-failover-{len(registered)}"
            with paho_client(b.port, client_id=client_id, clean_session=False) as sub:
                accepted = bool(sub.connack_rc) and sub.connack_rc[0] == 0
            if accepted:
                registered.append(client_id)
                if new_master.hget(f"{cluster.name}:c:{client_id}", "node") == "b":
                    break
            if time.monotonic() > deadline:
                where = {
                    srv.addr: connect(srv.addr).hget(f"{cluster.name}:c:{client_id}", "node")
                    for srv in sentinel.servers
                }
                raise AssertionError(
                    f"no registration reached the new master {sentinel.master_addr()}: "
                    f"{len(registered)} accepted; the last is on {where}"
                )
            time.sleep(0.5)
    finally:
        sentinel.stop()


def test_sigterm_drains_a_node_under_load_its_clients_move_and_nothing_acknowledged_is_lost(
    cluster: ClusterLauncher, redis_server: LocalRedis, tmp_path: Path
) -> None:
    nodes = [cluster.start(n) for n in ("a", "b", "c")]
    cluster.wait_linked()
    lb = LocalHAProxy(tmp_path / "haproxy", None, [f"127.0.0.1:{n.port}" for n in nodes]).start()
    try:
        _subscribe_everywhere(nodes, "keeper", "load/#")
        keeper = Qos1Subscriber(lb.frontend_port, "keeper")
        keeper.start()
        registry = redis_server.client()
        drained: list[BridgeProcess] = []

        def drain_busiest() -> None:
            owners = [
                registry.hget(f"{cluster.name}:c:{cid}", "node")
                for cid in ("keeper", "pub0", "pub1", "pub2")
            ]
            victim_id = max(("a", "b", "c"), key=owners.count)
            victim = cluster.nodes[victim_id]
            victim.stop()  # SIGTERM: drain, hand off, exit
            drained.append(victim)

        _publishers, pubacked = _run_load(lb.frontend_port, drain_busiest)
        _assert_delivered(keeper, pubacked, "SIGTERM drain")
        victim = drained[0]
        assert victim.proc is not None and victim.proc.returncode == 0
        log = victim.log_text()
        assert "shutting down" in log and "stopped" in log
        # What the drained node owned is owned by the survivors now.
        victim_id = next(n for n, node in cluster.nodes.items() if node is victim)
        left = registry.smembers(f"{cluster.name}:owned:{victim_id}")
        assert not left, left
    finally:
        lb.stop()


def test_a_node_added_under_load_takes_new_clients_without_restarting_the_others(
    cluster: ClusterLauncher, redis_server: LocalRedis, tmp_path: Path
) -> None:
    a, b = cluster.start("a"), cluster.start("b")
    cluster.wait_linked()
    pids = {a.pid, b.pid}
    lb = LocalHAProxy(tmp_path / "haproxy", None, [f"127.0.0.1:{n.port}" for n in (a, b)]).start()
    try:
        _subscribe_everywhere([a, b], "keeper", "load/#")
        keeper = Qos1Subscriber(lb.frontend_port, "keeper")
        keeper.start()
        added: list[BridgeProcess] = []

        def add_node() -> None:
            c = cluster.start("c")
            cluster.wait_linked()
            lb.reload([f"127.0.0.1:{n.port}" for n in (a, b, c)])
            added.append(c)

        _publishers, pubacked = _run_load(lb.frontend_port, add_node)
        _assert_delivered(keeper, pubacked, "node added")
        c = added[0]
        # leastconn sends new clients to the new node (it has none yet): of three new clients
        # held open together, at least one is on it, and it gets cross-node traffic.
        registry = redis_server.client()
        with contextlib.ExitStack() as stack:
            newcomers = {
                f"newcomer{i}": stack.enter_context(
                    paho_client(lb.frontend_port, client_id=f"newcomer{i}")
                )
                for i in range(3)
            }
            on_c = [
                client
                for cid, client in newcomers.items()
                if registry.hget(f"{cluster.name}:c:{cid}", "node") == "c"
            ]
            assert on_c, "no new client was balanced to the added node"
            newcomer = on_c[0]
            newcomer.client.subscribe("fresh/#", 1)
            with paho_client(a.port) as pub:
                wait_for_route(lambda p: pub.client.publish("fresh/probe", p), newcomer)
                pub.client.publish("fresh/x", "hi", qos=1).wait_for_publish(10)
            assert newcomer.get(10).payload == b"hi"
        assert {a.pid, b.pid} == pids and all(n.proc.poll() is None for n in (a, b, c))
    finally:
        lb.stop()


def test_a_node_frozen_past_the_timeout_lets_go_of_sessions_taken_over_meanwhile(
    cluster: ClusterLauncher,
) -> None:
    a, b = cluster.start("a"), cluster.start("b")
    cluster.wait_linked()
    lost = threading.Event()
    with paho_client(a.port, client_id="frozen-dev", clean_session=False) as dev:
        dev.client.on_disconnect = lambda *_args: lost.set()
        dev.client.subscribe("fz/#", 1)
        with paho_client(b.port) as pub:
            wait_for_route(lambda p: pub.client.publish("fz/probe", p), dev)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b.wait_for_log("node a is dead", 30)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        # On waking, a stops serving (its lease lapsed with no link to b) or hears that its
        # heartbeat lapsed; either way it lets go of the session b took.
        a.wait_for_log("client frozen-dev: owned by another node now; dropped here", 20)
        assert lost.wait(10), "node a kept a client whose session node b had taken over"
    publish_at = time.monotonic()
    with paho_client(b.port) as pub:
        pub.client.publish("fz/after", "kept", qos=1).wait_for_publish(10)
    # The session lives on, adopted by b: its subscription and the message are there.
    with paho_client(b.port, client_id="frozen-dev", clean_session=False) as dev:
        got = [m.payload for m in dev.drain(5, timeout=10) if not m.payload.startswith(b"probe")]
    assert got == [b"kept"], (got, time.monotonic() - publish_at)
