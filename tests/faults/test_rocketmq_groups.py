"""RocketMQ with more than one broker group: every message reaches its subscribers whichever
group stored it, groups come and go under load, and a master's death loses nothing.

Each test runs its own NameServer and brokers (deploy/rocketmq, SYNC_FLUSH) in its tmp_path and
stops them at the end. Messages are counted by payload: what the bridge acknowledged must be
delivered, QoS 2 exactly once. Counts are printed (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bridge.storage.rocketmq import RocketMQClient
from bridge.storage.rocketmq.groups import BrokerGroups
from tests.support.clients import RawClient
from tests.support.cluster import ClusterLauncher
from tests.support.load import (
    Qos1Publisher,
    Qos1Subscriber,
    Qos2Publisher,
    finish,
)
from tests.support.processes import BridgeProcess
from tests.support.qos import ExactlyOnceReceiver
from tests.support.rocketmq import LocalRocketMQ
from tests.support.rocketmq_use import admin_send
from tests.support.waiting import poll_until, wait_until

pytestmark = [pytest.mark.fault, pytest.mark.rocketmq, pytest.mark.timeout(420)]

SEND_TIMEOUT = 5.0
"""The bridge's `rocketmq_send_timeout`: above the brokers' slaveTimeout (3 s), so a master
whose slave is gone answers FLUSH_SLAVE_TIMEOUT before the bridge gives up on it."""
DELIVERY_TIMEOUT = 90.0
QUIET = 2.0
TOPICS = [f"t{k}/x" for k in range(12)]
"""Twelve first-level topics: twelve RocketMQ topics, spread over the groups."""


@pytest.fixture
def collectors() -> Iterator[list[Qos1Subscriber]]:
    started: list[Qos1Subscriber] = []
    yield started
    for collector in started:
        collector.stop.set()
    for collector in started:
        collector.join(10)


def start_collector(started: list[Qos1Subscriber], port: int, client_id: str, filters: list[str]):
    """A collector subscribed to `filters` (none: it resumes its persistent session)."""
    collector = Qos1Subscriber(port, client_id, filters)
    started.append(collector)
    collector.start()
    assert collector.ready.wait(30), f"{client_id} did not subscribe"
    return collector


def groups_of_topics(namesrv: str, topics: list[str]) -> dict[str, set[str]]:
    """RocketMQ topic -> the broker groups holding queues of it (NameServer routes)."""

    async def lookup() -> dict[str, set[str]]:
        async with RocketMQClient(
            namesrv, client_id="test-routes", producer_group="test-routes"
        ) as client:
            out = {}
            for topic in topics:
                route = await client.fetch_route(topic)
                out[topic] = {q.broker_name for q in route.queues}
            return out

    return asyncio.run(lookup())


def stored_on_group(namesrv: str, topic: str, group: str) -> int:
    """Messages of RocketMQ topic `topic` on broker group `group` (its queues' max offsets),
    asked the way notify and the Spark source ask (by group name)."""

    async def count() -> int:
        async with RocketMQClient(namesrv, client_id="test-count", producer_group="t") as client:
            route = await client.fetch_route(topic)
            queues = [qid for name, qid in route.read_queues() if name == group]
            return sum([await client.max_offset(topic, qid, broker_name=group) for qid in queues])

    return asyncio.run(count())


def in_publisher_order(arrived: list[tuple[str, str]]) -> list[str]:
    """Payloads "pub:topic:i" whose first delivery came after a later i of the same publisher
    and topic (redeliveries of a QoS 1 message do not count)."""
    last: dict[tuple[str, str], int] = {}
    seen: set[str] = set()
    wrong = []
    for _, payload in arrived:
        if payload in seen:
            continue
        seen.add(payload)
        pub, topic, i = payload.rsplit(":", 2)
        if int(i) < last.get((pub, topic), -1):
            wrong.append(payload)
        last[(pub, topic)] = int(i)
    return wrong


def publish_rounds(port: int, client_id: str, rounds: range, topics: list[str]) -> list[str]:
    """QoS 1 messages "client:topic:i", each PUBACKed before the next."""
    client = RawClient(port, timeout=15)
    client.connect(client_id, clean_session=True)
    payloads = []
    try:
        for i in rounds:
            for topic in topics:
                payload = f"{client_id}:{topic}:{i}"
                client.publish(topic, payload.encode(), 1, packet_id=i % 60000 + 1)
                payloads.append(payload)
    finally:
        client.disconnect()
    return payloads


def node_on(
    mq: LocalRocketMQ, bridge_factory: Callable[..., BridgeProcess], *extra: str
) -> BridgeProcess:
    """A store=rocketmq node with light queues of its own (a namespace of its own): the module's
    tests share one two-group cluster, and a ClientId of one test finds no queue of another's."""
    return bridge_factory(
        "store=rocketmq",
        f"rocketmq_namesrv={mq.namesrv_addr}",
        f"rocketmq_send_timeout={SEND_TIMEOUT:g}",
        f"rocketmq_namespace=g{uuid.uuid4().hex[:8]}",
        *extra,
    )


# --- two groups -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    """Two broker groups the module's tests that kill nothing share (each in a namespace of
    its own); the tests that kill a broker or add a group start their own."""
    mq = LocalRocketMQ(tmp_path_factory.mktemp("two-groups") / "rocketmq", groups=2, timer=False)
    mq.start()
    try:
        yield mq
    finally:
        mq.stop(graceful=False)


def test_messages_stored_on_either_broker_group_reach_exact_and_wildcard_subscribers_in_order(
    two_groups: LocalRocketMQ, bridge_factory, collectors
) -> None:
    node = node_on(two_groups, bridge_factory)
    wildcard = start_collector(collectors, node.port, "wild", ["+/x"])
    exact = start_collector(collectors, node.port, "exact", ["t3/x", "t7/x"])
    both = start_collector(collectors, node.port, "both", ["#", "t5/x"])  # overlapping

    results: dict[str, list[str]] = {}
    threads = [
        threading.Thread(
            target=lambda p=p: results.__setitem__(
                p, publish_rounds(node.port, p, range(15), TOPICS)
            )
        )
        for p in ("pub0", "pub1", "pub2")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    published = {payload for payloads in results.values() for payload in payloads}
    assert len(published) == 3 * 15 * len(TOPICS)
    for_exact = {p for p in published if p.split(":")[1] in ("t3/x", "t7/x")}

    delivered_all = poll_until(
        lambda: (
            published <= set(wildcard.delivered)
            and for_exact <= set(exact.delivered)
            and published <= set(both.delivered)
        ),
        DELIVERY_TIMEOUT,
    )
    time.sleep(QUIET)
    routes = groups_of_topics(two_groups.namesrv_addr, [t.split("/")[0] for t in TOPICS])
    used = set().union(*routes.values())
    print(
        f"\ntwo groups: published {len(published)}, wildcard {len(set(wildcard.delivered))} "
        f"distinct / {len(wildcard.arrived)}, exact {len(set(exact.delivered))} / "
        f"{len(exact.arrived)}, overlapping {len(set(both.delivered))} / {len(both.arrived)}; "
        f"topics per group {Counter(g for gs in routes.values() for g in gs)}, "
        f"all delivered in time: {delivered_all}"
    )
    assert used == {"broker-a", "broker-b"}, routes  # the topics really are on both groups
    assert all(len(groups) == 1 for groups in routes.values()), routes  # one group per topic
    for collector, expected in ((wildcard, published), (exact, for_exact), (both, published)):
        lost = expected - set(collector.delivered)
        assert not lost, f"{collector.client_id}: {len(lost)} lost, e.g. {sorted(lost)[:5]}"
        assert set(collector.delivered) == expected, collector.client_id
        assert not in_publisher_order(collector.arrived), collector.client_id
    # Overlapping filters of one client: one copy of each message.
    assert max(both.delivered.values()) == 1


def test_a_backend_message_produced_on_the_second_group_reaches_mqtt_subscribers(
    two_groups: LocalRocketMQ, bridge_factory, collectors
) -> None:
    """notify reads every group: a message a backend sends straight to broker-b (RocketMQ's own
    admin tool) is dispatched to the MQTT subscribers."""
    node = node_on(two_groups, bridge_factory)
    two_groups.create_topic("pay")  # on every group: mqadmin sends to a group that has it
    collector = start_collector(collectors, node.port, "device", ["pay/#"])
    time.sleep(3.0)  # notify finds the new topic (it looks every 2 s)
    for group in ("broker-a", "broker-b"):
        sent = (f"pay/{group}/1", f"from {group}")
        out = admin_send(
            two_groups,
            *("-t", "pay", "-b", group, "-i", "0"),  # -b alone is ignored without -i
            *("-c", sent[0], "-p", sent[1]),
            arrived=lambda timeout, sent=sent: poll_until(
                lambda: sent in collector.arrived, timeout
            ),
        )
        assert out == "" or ("SEND_OK" in out and group in out), out
    assert poll_until(lambda: len(collector.arrived) >= 2, DELIVERY_TIMEOUT), collector.arrived
    time.sleep(QUIET)
    assert sorted(collector.arrived) == [
        ("pay/broker-a/1", "from broker-a"),
        ("pay/broker-b/1", "from broker-b"),
    ]


# --- a master killed, its slave present -----------------------------------------------------------


class ExactlyOnceSubscriber(threading.Thread):
    """An `ExactlyOnceReceiver` on its own thread, reconnecting when cut."""

    def __init__(self, port: int, client_id: str, topic_filter: str) -> None:
        super().__init__(name=client_id, daemon=True)
        self.receiver = ExactlyOnceReceiver(port, client_id)
        self.topic_filter = topic_filter
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                client = self.receiver.connect()
                if not self.ready.is_set():
                    assert client.subscribe(self.topic_filter, 2) == [2]
                    self.ready.set()
                while not self.stop.is_set():
                    self.receiver.receive(10**9, timeout=0.5)
            except (ConnectionError, OSError, TimeoutError):
                time.sleep(0.2)
        if self.receiver.client is not None:
            self.receiver.client.close()


def topics_on(group: str, count: int, prefix: str) -> list[str]:
    """`count` first-level topics the rendezvous choice puts on `group` (of broker-a and b)."""
    chooser = BrokerGroups()
    out = []
    for k in range(1000):
        name = f"{prefix}{k}"
        if chooser.pick(name, ["broker-a", "broker-b"]) == group:
            out.append(name)
            if len(out) == count:
                return out
    raise AssertionError(f"no {count} topics for {group}")


def test_kill_9_of_a_master_with_its_slave_loses_no_acknowledged_message(
    tmp_path: Path, bridge_factory, collectors
) -> None:
    """QoS 1 and QoS 2 publishers on topics of broker-a; its master is killed (kill -9) and
    stays down. Publishers move to broker-b, what broker-a acknowledged is read from its slave
    (a subscriber that was offline at the kill reads all of it there), and QoS 2 is delivered
    exactly once."""
    mq = LocalRocketMQ(tmp_path / "rocketmq", groups=2, slaves=1, timer=False)
    mq.start()
    try:
        node = node_on(mq, bridge_factory)
        qos1_topics = topics_on("broker-a", 2, "k")
        (qos2_topic,) = topics_on("broker-a", 1, "e")
        live = start_collector(collectors, node.port, "live", ["+/x"])
        late = start_collector(collectors, node.port, "late", ["+/x"])
        late.stop.set()
        late.join(10)
        exactly = ExactlyOnceSubscriber(node.port, "exactly", f"{qos2_topic}/#")
        exactly.start()
        assert exactly.ready.wait(30)

        stop = threading.Event()
        qos1 = []
        for i, topic in enumerate(qos1_topics):
            publisher = Qos1Publisher(node.port, f"pub{i}", stop)
            publisher.topic = f"{topic}/x"
            qos1.append(publisher)
        qos2 = Qos2Publisher(node.port, "pub-q2", f"{qos2_topic}/x", stop)
        for publisher in [*qos1, qos2]:
            publisher.start()

        def acked() -> int:
            return sum(len(p.acks) for p in qos1) + len(qos2.recorded)

        try:
            wait_until(lambda: acked() >= 200, 90, "200 acknowledgements before the kill")
            at_kill = acked()
            mq.kill_broker("broker-a", 0)
            killed_at = time.monotonic()
            wait_until(lambda: acked() >= at_kill + 200, 120, "200 acknowledgements after the kill")
            after = acked() - at_kill
        finally:
            stop.set()
        finish(stop, [*qos1, qos2])

        late_again = start_collector(collectors, node.port, "late", [])  # its session resumes
        pubacked = set().union(*(p.acked for p in qos1))
        assert pubacked == set().union(*(p.published for p in qos1))
        assert qos2.completed == qos2.published
        try:
            poll_until(
                lambda: (
                    pubacked <= set(live.delivered)
                    and pubacked <= set(late_again.delivered)
                    and qos2.recorded <= set(exactly.receiver.delivered)
                ),
                DELIVERY_TIMEOUT,
            )
            time.sleep(QUIET)
        finally:
            exactly.stop.set()
            exactly.join(10)
        routes = groups_of_topics(mq.namesrv_addr, [*qos1_topics, qos2_topic])
        on_slave = stored_on_group(mq.namesrv_addr, qos1_topics[0], "broker-a")
        q2 = exactly.receiver.delivered
        print(
            f"\nmaster kill: acknowledged {at_kill} before, {after} after (in "
            f"{time.monotonic() - killed_at:.1f} s); QoS 1 PUBACKed {len(pubacked)}, live got "
            f"{len(set(live.delivered))} distinct / {len(live.arrived)}, late (offline at the "
            f"kill) {len(set(late_again.delivered))} / {len(late_again.arrived)}; QoS 2 PUBRECed "
            f"{len(qos2.recorded)}, delivered {len(q2)} distinct / {sum(q2.values())}; publisher "
            f"connections closed {sum(len(p.closed_at) for p in [*qos1, qos2])}; routes {routes}; "
            f"{qos1_topics[0]} on broker-a's slave: {on_slave}"
        )
        for collector in (live, late_again):
            lost = pubacked - set(collector.delivered)
            assert not lost, f"{collector.client_id}: {len(lost)} PUBACKed lost: {sorted(lost)[:5]}"
        lost2 = qos2.recorded - set(q2)
        assert not lost2, f"{len(lost2)} PUBRECed QoS 2 messages lost: {sorted(lost2)[:5]}"
        twice = {p: n for p, n in q2.items() if n > 1}
        assert not twice, f"QoS 2 delivered more than once: {sorted(twice.items())[:5]}"
        assert set(q2) <= qos2.published
        # Requests about broker-a's queues of a normal topic (notify's and the Spark source's
        # offsets) are answered by its slave while the master is down.
        assert on_slave > 0
        # The publishers really moved: their topics were created on broker-b after the kill.
        assert all("broker-b" in groups for groups in routes.values()), routes
    finally:
        mq.stop(graceful=False)


# --- a group added under load, then the first one drained -----------------------------------------


def test_a_group_added_under_load_and_a_drained_group_lose_nothing(
    tmp_path: Path, bridge_factory, collectors
) -> None:
    """One group under QoS 1 load; broker-b joins (the node learns it without a restart); then
    broker-a loses its write permission: its topics move to broker-b, and what it holds is read
    to its end."""
    mq = LocalRocketMQ(tmp_path / "rocketmq", groups=1, spare_groups=1, timer=False)
    mq.start()
    try:
        node = node_on(mq, bridge_factory)
        collector = start_collector(collectors, node.port, "all", ["+/x"])
        stop = threading.Event()
        publishers = []
        for i in range(6):
            publisher = Qos1Publisher(node.port, f"pub{i}", stop)
            publisher.topic = f"a{i}/x"
            publishers.append(publisher)
            publisher.start()

        def acked() -> int:
            return sum(len(p.acks) for p in publishers)

        late_topics: list[str] = []
        try:
            wait_until(lambda: acked() >= 150, 90, "150 PUBACKs on one group")
            mq.add_group("broker-b")
            # The node looks for new groups every 5 s and says when it found one.
            node.wait_for_log("reading their parts of every queue", timeout=30)
            # Topics first used now are spread over both groups.
            late_topics = topics_on("broker-b", 2, "n")
            for i, topic in enumerate(late_topics):
                publisher = Qos1Publisher(node.port, f"new{i}", stop)
                publisher.topic = f"{topic}/x"
                publishers.append(publisher)
                publisher.start()
            at_add = acked()
            wait_until(lambda: acked() >= at_add + 150, 90, "150 PUBACKs with two groups")
            mq.set_write_permission("broker-a", False)
            old_topics = [f"a{i}" for i in range(6)]

            def moved() -> bool:
                time.sleep(0.5)  # a route lookup per check, not per 20 ms
                routes = groups_of_topics(mq.namesrv_addr, old_topics)
                return all("broker-b" in groups for groups in routes.values())

            # The nodes learn of the drain within 5 s (the brokers still store what is sent).
            wait_until(moved, 60, "the drained group's topics to move to broker-b")
            at_drain = acked()
            wait_until(lambda: acked() >= at_drain + 150, 120, "150 PUBACKs after the drain")
        finally:
            stop.set()
        finish(stop, publishers)
        pubacked = set().union(*(p.acked for p in publishers))
        assert pubacked == set().union(*(p.published for p in publishers))
        poll_until(lambda: pubacked <= set(collector.delivered), DELIVERY_TIMEOUT)
        time.sleep(QUIET)
        routes = groups_of_topics(mq.namesrv_addr, [f"a{i}" for i in range(6)] + list(late_topics))
        print(
            f"\ngroup added and drained: PUBACKed {len(pubacked)}, delivered "
            f"{len(set(collector.delivered))} distinct / {len(collector.arrived)}; routes {routes}"
        )
        lost = pubacked - set(collector.delivered)
        assert not lost, f"{len(lost)} PUBACKed lost, e.g. {sorted(lost)[:5]}"
        assert all(routes[t] == {"broker-b"} for t in late_topics), routes  # new topics: new group
        assert all("broker-b" in routes[f"a{i}"] for i in range(6)), routes  # moved off broker-a
    finally:
        mq.stop(graceful=False)


# --- a cluster over two groups --------------------------------------------------------------------


def test_a_three_node_cluster_over_two_groups_delivers_across_nodes_and_moves_sessions(
    two_groups: LocalRocketMQ, bridge_factory, redis_server, collectors
) -> None:
    """Publishers on node1, subscribers on node2 and node3 (peers wake each other per part of a
    queue); a persistent session that queued messages of both groups while offline resumes on
    another node (its positions, one per part, travel through Redis) and gets all of them."""
    launcher = ClusterLauncher(
        bridge_factory, two_groups.namesrv_addr, tuple(redis_server.bridge_settings())
    )
    node1 = launcher.start("n1")
    node2 = launcher.start("n2")
    node3 = launcher.start("n3")
    launcher.wait_linked()
    wildcard = start_collector(collectors, node2.port, "wild", ["+/x"])
    exact = start_collector(collectors, node3.port, "exact", ["t3/x", "t8/x"])
    mover = start_collector(collectors, node2.port, "mover", ["#"])
    time.sleep(2.0)  # subscriptions reach node1 through the peer links
    first = publish_rounds(node1.port, "pub0", range(5), TOPICS)
    poll_until(lambda: set(first) <= set(mover.delivered), DELIVERY_TIMEOUT)
    mover.stop.set()
    mover.join(10)
    second = publish_rounds(node1.port, "pub0", range(5, 10), TOPICS)  # queued for the mover
    moved = start_collector(collectors, node3.port, "mover", [])  # resumes on another node
    published = set(first) | set(second)
    for_exact = {p for p in published if p.split(":")[1] in ("t3/x", "t8/x")}
    poll_until(
        lambda: (
            published <= set(wildcard.delivered)
            and for_exact <= set(exact.delivered)
            and set(second) <= set(moved.delivered)
        ),
        DELIVERY_TIMEOUT,
    )
    time.sleep(QUIET)
    routes = groups_of_topics(two_groups.namesrv_addr, [t.split("/")[0] for t in TOPICS])
    print(
        f"\ncluster over two groups: published {len(published)}, wildcard "
        f"{len(set(wildcard.delivered))}, exact {len(set(exact.delivered))}, moved session "
        f"{len(set(moved.delivered) & set(second))} of {len(second)} queued while offline; "
        f"topics per group {Counter(g for gs in routes.values() for g in gs)}"
    )
    assert set().union(*routes.values()) == {"broker-a", "broker-b"}
    assert set(wildcard.delivered) == published
    assert set(exact.delivered) == for_exact
    lost = set(second) - set(moved.delivered)
    assert not lost, f"the moved session lost {len(lost)}: {sorted(lost)[:5]}"
    for collector in (wildcard, exact, moved):
        assert not in_publisher_order(collector.arrived), collector.client_id


def test_an_offline_session_over_its_limit_drops_its_oldest_messages_of_both_groups(
    two_groups: LocalRocketMQ, bridge_factory, collectors
) -> None:
    """The queue limit of an offline session counts every part, and trimming drops the oldest
    messages whichever group holds them (by time: seqs of two groups are not comparable)."""
    node = node_on(two_groups, bridge_factory, "max_queued_messages=60")
    sleeper = start_collector(collectors, node.port, "sleeper", ["+/x"])
    sleeper.stop.set()
    sleeper.join(10)
    published = []
    for i in range(10):
        published += publish_rounds(node.port, "pub0", range(i, i + 1), TOPICS)
        time.sleep(0.05)  # rounds apart in time
    time.sleep(2.0)  # housekeeping trims the offline session
    woken = start_collector(collectors, node.port, "sleeper", [])
    poll_until(lambda: len(woken.delivered) >= 50, DELIVERY_TIMEOUT)
    time.sleep(QUIET)
    rounds = Counter(int(p.rsplit(":", 1)[1]) for p in woken.delivered)
    print(f"\ntrim over two groups: delivered {len(woken.delivered)} of 120, per round {rounds}")
    assert 50 <= len(woken.delivered) <= 60
    assert rounds[9] == len(TOPICS)  # the newest round, on both groups, all there
    assert rounds[0] == 0  # the oldest, on both groups, all dropped
    assert not in_publisher_order(woken.arrived)
