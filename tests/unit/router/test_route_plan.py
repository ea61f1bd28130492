"""The routing decision (`bridge.router.plan`) against a brute-force reading of the rules.

The reference matches every filter against the topic with `topic_matches` (no trie), and states
each rule of the plan directly: who gets a QoS 0 copy, which peers get it forwarded, which queues
a QoS 1/2 message is stored on, whom to wake, and one member per matching shared group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.mqtt.topics import topic_matches
from bridge.router.plan import (
    ConnectionTable,
    DirectRoutes,
    plan_route,
    possible_queues,
    readers_of,
)
from bridge.router.queues import (
    client_queue,
    filter_queue,
    peer_subscriber,
    shared_queue,
)
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie

LEVELS = ["a", "b", "$SYS", ""]
CLIENTS = ["c1", "c2", "c3", "c4"]
PEERS = ["n2", "n3"]

topics = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3).map("/".join).filter(bool)
filter_levels = st.sampled_from([*LEVELS, "+", "#"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(filter_levels, min_size=1, max_size=3))
    if "#" in levels:
        levels = levels[: levels.index("#") + 1]  # '#' only last (MQTT-4.7.1-2)
    return "/".join(levels) or "a"


subscribers = st.sampled_from([*CLIENTS, *(peer_subscriber(p) for p in PEERS)])
subscriptions = st.lists(st.tuples(filters(), subscribers, st.integers(0, 2)), max_size=10)
# Few group filters, so that groups have several members.
groups = st.lists(
    st.tuples(
        st.sampled_from(["g1", "g2"]),
        st.sampled_from(["a/#", "+/b", "#", "a"]),
        st.sampled_from(CLIENTS),
        st.integers(0, 2),
    ),
    max_size=8,
)
client_sets = st.sets(st.sampled_from(CLIENTS))


def build(subs: list[tuple[str, str, int]], members: list[tuple[str, str, str, int]]):
    trie = SubscriptionTrie()
    table: dict[str, dict[str, int]] = {}
    for topic_filter, subscriber, qos in subs:
        trie.subscribe(topic_filter, subscriber, qos)
        table.setdefault(topic_filter, {})[subscriber] = qos
    shared = SharedSubscriptions()
    shares: dict[str, dict[str, int]] = {}
    for group, topic_filter, client, qos in members:
        share = f"$share/{group}/{topic_filter}"
        shared.subscribe(share, group, topic_filter, client, qos)
        shares.setdefault(share, {})[client] = qos
    return trie, table, shared, shares


def reader_of(client_id: str) -> str:
    """Clients c3 and c4 have their sessions on peer n2 in these tests."""
    return peer_subscriber("n2") if client_id in ("c3", "c4") else client_id


def inner(share: str) -> str:
    return share.split("/", 2)[2]


@settings(max_examples=400)
@given(subscriptions, groups, topics, client_sets, client_sets)
def test_qos0_plan_sends_each_connected_subscriber_one_copy_and_forwards_to_matching_peers(
    subs, members, topic, connected, remote
):
    trie, table, shared, shares = build(subs, members)
    reachable = connected | remote
    plan = plan_route(
        topic, 0, trie, shared, connected=connected, reachable=reachable.__contains__,
        reader_of=reader_of,
    )  # fmt: skip
    matched = {s for f, subs_ in table.items() if topic_matches(f, topic) for s in subs_}
    matching_groups = [s for s in shares if topic_matches(inner(s), topic)]

    non_shared_direct = {c for c in matched if c in connected}
    assert Counter(plan.peers) == Counter(s[1:] for s in matched if s.startswith("\x00")), (
        "each matching peer is forwarded the message once"
    )
    # Every matching group yields one direct copy, one copy handed to a peer, or one unserved.
    assert len(plan.direct) - len(non_shared_direct) + len(plan.handed) + plan.unserved == len(
        matching_groups
    )
    assert non_shared_direct <= set(plan.direct)
    for member in plan.handed:
        assert member in remote and member not in connected
    reachable_groups = [s for s in matching_groups if reachable & set(shares[s])]
    assert plan.unserved == len(matching_groups) - len(reachable_groups)
    assert not plan.queues and not plan.readers, "QoS 0 is never queued"


@settings(max_examples=400)
@given(subscriptions, groups, topics, client_sets, client_sets, st.integers(1, 2))
def test_qos1_plan_queues_every_matching_filter_and_one_member_per_shared_group(
    subs, members, topic, connected, remote, qos
):
    trie, table, shared, shares = build(subs, members)
    reachable = connected | remote
    plan = plan_route(
        topic, qos, trie, shared, connected=connected, reachable=reachable.__contains__,
        reader_of=reader_of,
    )  # fmt: skip
    matching_filters = [f for f in table if topic_matches(f, topic)]
    matching_groups = [s for s in shares if topic_matches(inner(s), topic)]

    filter_queues = [q for q in plan.queues if q.startswith("f:")]
    assert sorted(filter_queues) == sorted(filter_queue(f) for f in matching_filters)
    shared_queues = [q for q in plan.queues if q.startswith("s:")]
    # One pick per matching group: a queue for a member granted QoS>0, else a direct copy.
    assert len(shared_queues) + len(plan.direct) + len(plan.handed) == len(matching_groups)
    assert plan.unserved == 0 and not plan.peers
    picked: list[str] = []
    for queue in shared_queues:
        share, _, member = queue[2:].partition("\x00")
        assert queue == shared_queue(share, member)
        assert shares[share][member] > 0
        if reachable & set(shares[share]):
            assert member in reachable, "a reachable member is preferred"
        picked.append(reader_of(member))
    expected_readers = Counter(s for f in matching_filters for s in table[f]) + Counter(picked)
    assert Counter(plan.readers) == expected_readers


@settings(max_examples=300)
@given(subscriptions, groups, topics, client_sets, st.integers(1, 2), st.integers(1, 4))
def test_possible_queues_hold_every_queue_any_qos1_plan_picks(
    subs, members, topic, connected, qos, rounds
):
    trie, table, shared, shares = build(subs, members)
    possible = possible_queues(topic, trie, shared)
    assert len(possible) == len(set(possible)), "each queue once"
    for _ in range(rounds):  # each plan advances the groups' round-robins
        plan = plan_route(
            topic, qos, trie, shared, connected=connected, reachable=connected.__contains__,
            reader_of=reader_of,
        )  # fmt: skip
        assert set(plan.queues) <= set(possible)
    matching_filters = [f for f in table if topic_matches(f, topic)]
    matching_groups = [s for s in shares if topic_matches(inner(s), topic)]
    expected = [filter_queue(f) for f in matching_filters] + [
        shared_queue(s, m) for s in matching_groups for m in shares[s]
    ]
    assert sorted(possible) == sorted(expected)


def test_shared_group_members_take_turns():
    trie = SubscriptionTrie()
    shared = SharedSubscriptions()
    for client in ("c1", "c2", "c3"):
        shared.subscribe("$share/g/jobs/#", "g", "jobs/#", client, 1)
    everyone = {"c1", "c2", "c3"}
    picks = [
        plan_route(
            "jobs/1", 1, trie, shared, connected=everyone, reachable=everyone.__contains__,
            reader_of=str,
        ).queues[0].rpartition("\x00")[2]
        for _ in range(6)
    ]  # fmt: skip
    assert picks == ["c1", "c2", "c3", "c1", "c2", "c3"]


def test_unreachable_shared_members_still_get_qos1_queued_but_qos0_is_unserved():
    trie = SubscriptionTrie()
    shared = SharedSubscriptions()
    shared.subscribe("$share/g/t", "g", "t", "gone", 1)
    nobody: set[str] = set()
    kwargs = {"connected": nobody, "reachable": nobody.__contains__, "reader_of": str}
    qos1 = plan_route("t", 1, trie, shared, **kwargs)
    assert qos1.queues == [shared_queue("$share/g/t", "gone")] and qos1.readers == ["gone"]
    qos0 = plan_route("t", 0, trie, shared, **kwargs)
    assert qos0.unserved == 1 and not qos0.direct and not qos0.handed


def test_a_shared_member_granted_qos0_gets_a_direct_copy_of_a_qos1_message():
    trie = SubscriptionTrie()
    shared = SharedSubscriptions()
    shared.subscribe("$share/g/t", "g", "t", "here", 0)
    shared.subscribe("$share/h/t", "h", "t", "there", 0)
    plan = plan_route(
        "t", 1, trie, shared, connected={"here"}, reachable={"here", "there"}.__contains__,
        reader_of=str,
    )  # fmt: skip
    assert plan.direct == ["here"] and plan.handed == ["there"] and not plan.queues


def test_readers_of_each_kind_of_queue():
    trie = SubscriptionTrie()
    trie.subscribe("a/+", "c1", 1)
    trie.subscribe("a/+", peer_subscriber("n2"), 0)
    assert sorted(readers_of(filter_queue("a/+"), trie, reader_of)) == sorted(
        ["c1", peer_subscriber("n2")]
    )
    assert readers_of(client_queue("c9"), trie, reader_of) == ["c9"]
    assert readers_of(shared_queue("$share/g/a", "c3"), trie, reader_of) == [peer_subscriber("n2")]
    assert readers_of("x:nothing", trie, reader_of) == []


operations = st.lists(
    st.one_of(
        st.tuples(st.just("subscribe"), filters(), subscribers),
        st.tuples(st.just("unsubscribe"), filters(), subscribers),
        st.tuples(st.just("connect"), st.sampled_from(CLIENTS), st.none()),
        st.tuples(st.just("disconnect"), st.sampled_from(CLIENTS), st.none()),
        st.tuples(st.just("publish"), topics, st.none()),
    ),
    max_size=40,
)


def published(
    ops: list[tuple[str, str, str | None]], qos: int
) -> Iterator[tuple[str, SubscriptionTrie, ConnectionTable[object]]]:
    """Carry out `ops` (subscriptions at `qos`) on a trie and a connection table; at each
    "publish", yield its topic with both as they are then."""
    trie = SubscriptionTrie()
    connected: ConnectionTable[object] = ConnectionTable()
    for op, a, b in ops:
        if op == "subscribe":
            assert b is not None
            trie.subscribe(a, b, qos)
        elif op == "unsubscribe":
            assert b is not None
            trie.unsubscribe(a, b)
        elif op == "connect":
            connected[a] = object()
        elif op == "disconnect":
            connected.pop(a, None)
        else:
            yield a, trie, connected


@settings(max_examples=500)
@given(operations)
@example([("subscribe", "a", "c1"), ("publish", "a", None), ("connect", "c1", None),
          ("publish", "a", None), ("disconnect", "c1", None), ("publish", "a", None)])  # fmt: skip
@example([("connect", "c1", None), ("connect", "c2", None), ("subscribe", "a", "c1"),
          ("publish", "a", None), ("subscribe", "+", "c2"), ("publish", "a", None)])  # fmt: skip
def test_remembered_qos0_plans_equal_fresh_ones_after_any_changes(ops):
    routes = DirectRoutes(size=8)
    for topic, trie, connected in published(ops, 0):
        remembered = routes.plan(topic, trie, connected)
        fresh = plan_route(topic, 0, trie, SharedSubscriptions(), connected, bool, str)
        assert sorted(remembered.direct) == sorted(fresh.direct)
        assert sorted(remembered.peers) == sorted(fresh.peers)


@settings(max_examples=500)
@given(operations, st.sampled_from([1, 2]))
@example([("subscribe", "a", "c1"), ("publish", "a", None), ("subscribe", "a", "c2"),
          ("publish", "a", None), ("unsubscribe", "a", "c1"), ("publish", "a", None)],
         1)  # fmt: skip
@example([("subscribe", "a", "c1"), ("publish", "a", None), ("subscribe", "+", "c1"),
          ("publish", "a", None)], 2)  # fmt: skip
def test_remembered_qos1_and_qos2_plans_equal_fresh_ones_after_any_changes(ops, qos):
    routes = DirectRoutes(size=8)
    for topic, trie, connected in published(ops, 1):
        remembered = routes.queued_plan(topic, trie)
        fresh = plan_route(topic, qos, trie, SharedSubscriptions(), connected, bool, str)
        assert sorted(remembered.queues) == sorted(fresh.queues)
        assert sorted(remembered.readers) == sorted(fresh.readers)
        assert not (remembered.direct or remembered.peers or remembered.handed)


def test_every_change_of_the_connection_table_moves_its_version():
    table: ConnectionTable[int] = ConnectionTable()
    versions = [table.version]
    table["a"] = 1
    versions.append(table.version)
    table["a"] = 5
    versions.append(table.version)
    table.update({"b": 2}, e=6)
    versions.append(table.version)
    table |= {"c": 3}
    versions.append(table.version)
    assert table.setdefault("d", 4) == 4
    versions.append(table.version)
    assert table == {"a": 5, "b": 2, "e": 6, "c": 3, "d": 4}
    del table["a"]
    versions.append(table.version)
    assert table.pop("b") == 2
    versions.append(table.version)
    table.popitem()
    versions.append(table.version)
    table.clear()
    versions.append(table.version)
    assert versions == sorted(set(versions)), "each change moved the version"
    assert table == {} and isinstance(table, dict)


def test_a_remembered_qos0_plan_is_handed_out_again_until_the_match_or_the_connections_change():
    trie = SubscriptionTrie()
    trie.subscribe("a", "c1", 0)
    connected: ConnectionTable[object] = ConnectionTable()
    connected["c1"] = object()
    routes = DirectRoutes(size=8)
    first = routes.plan("a", trie, connected)
    assert first.direct and routes.plan("a", trie, connected) is first
    connected["c2"] = object()
    second = routes.plan("a", trie, connected)
    assert second is not first and routes.plan("a", trie, connected) is second
    trie.subscribe("a", "c2", 0)
    third = routes.plan("a", trie, connected)
    assert third is not second and len(third.direct) == 2


def test_a_remembered_qos1_plan_is_handed_out_again_until_the_match_changes():
    trie = SubscriptionTrie()
    trie.subscribe("a", "c1", 1)
    routes = DirectRoutes(size=8)
    first = routes.queued_plan("a", trie)
    assert first.queues and routes.queued_plan("a", trie) is first
    trie.subscribe("+", "c1", 1)
    second = routes.queued_plan("a", trie)
    assert second is not first and routes.queued_plan("a", trie) is second


def test_remembered_plans_are_forgotten_when_size_topics_are_remembered():
    trie = SubscriptionTrie()
    trie.subscribe("#", "c1", 1)
    connected: ConnectionTable[object] = ConnectionTable()
    routes = DirectRoutes(size=2)
    plan_a, queued_a = routes.plan("a", trie, connected), routes.queued_plan("a", trie)
    routes.plan("b", trie, connected), routes.queued_plan("b", trie)
    assert routes.plan("a", trie, connected) is plan_a
    assert routes.queued_plan("a", trie) is queued_a
    routes.plan("c", trie, connected), routes.queued_plan("c", trie)
    assert routes.plan("a", trie, connected) is not plan_a
    assert routes.queued_plan("a", trie) is not queued_a
