"""Broker groups of the RocketMQ store: part names, seqs, where a topic's messages go."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.rocketmq import groups as groups_module
from bridge.storage.rocketmq.groups import (
    BrokerGroups,
    group_seq,
    group_tag,
    part_name,
    split_part,
)
from bridge.storage.rocketmq.types import BrokerInfo

queue_names = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
group_names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1, max_size=20
)


def cluster(*names: str, slaves: bool = False) -> dict[str, BrokerInfo]:
    addrs = {"0": "127.0.0.1:1"} | ({"1": "127.0.0.1:2"} if slaves else {})
    return {name: BrokerInfo(name, "DefaultCluster", dict(addrs)) for name in names}


@given(group_names, queue_names)
def test_a_part_name_gives_back_its_group_and_queue(group: str, queue: str) -> None:
    assert split_part(part_name(group, queue)) == (group, queue)


@given(st.sampled_from(["f:", "c:", "s:"]), queue_names)
def test_no_bridge_queue_name_is_taken_for_a_part(kind: str, rest: str) -> None:
    assert split_part(kind + rest) is None


def test_the_same_commit_log_offset_on_two_groups_gives_two_seqs() -> None:
    a, b = group_tag("broker-a"), group_tag("broker-b")
    assert a != b
    seqs = {group_seq(offset, tag) for offset in range(1000) for tag in (a, b)}
    assert len(seqs) == 2000
    assert group_seq(5, a) < group_seq(6, a)  # increasing per group


def test_every_node_picks_the_same_group_for_a_topic_whatever_the_order() -> None:
    for topic in (f"factory{i}" for i in range(50)):
        first = BrokerGroups().pick(topic, ["broker-a", "broker-b", "broker-c"])
        second = BrokerGroups().pick(topic, ["broker-c", "broker-a", "broker-b"])
        assert first == second


def test_topics_spread_over_the_groups() -> None:
    chosen = [BrokerGroups().pick(f"t{i}", ["broker-a", "broker-b"]) for i in range(200)]
    assert 60 < chosen.count("broker-a") < 140


def test_a_new_group_takes_topics_only_from_fresh_choices_and_moves_no_pinned_topic() -> None:
    groups = BrokerGroups()
    topics = [f"t{i}" for i in range(200)]
    before = {t: groups.pick(t, ["broker-a", "broker-b"]) for t in topics}
    # Pinned: the group a topic went to keeps it while it takes writes (publisher order).
    assert {t: groups.pick(t, ["broker-a", "broker-b", "broker-c"]) for t in topics} == before
    # A node that starts now moves only the topics the new group wins (rendezvous hashing).
    fresh = {t: BrokerGroups().pick(t, ["broker-a", "broker-b", "broker-c"]) for t in topics}
    moved = [t for t in topics if fresh[t] != before[t]]
    assert moved and all(fresh[t] == "broker-c" for t in moved)


def test_a_topic_leaves_a_group_that_stops_taking_writes() -> None:
    groups = BrokerGroups()
    first = groups.pick("t", ["broker-a", "broker-b"])
    other = "broker-b" if first == "broker-a" else "broker-a"
    assert groups.pick("t", [other]) == other
    assert groups.pick("t", ["broker-a", "broker-b"]) == other  # and stays where it went
    assert groups.pick("t", []) is None


def test_a_failed_group_gets_no_topics_for_a_while_unless_it_is_the_only_one(monkeypatch) -> None:
    groups = BrokerGroups()
    first = groups.pick("t", ["broker-a", "broker-b"])
    assert first is not None
    groups.failed(first)
    other = groups.pick("t", ["broker-a", "broker-b"])
    assert other not in (None, first)
    assert groups.pick("u", [first]) == first  # nothing else takes writes: wait on it
    now = time.monotonic()
    monkeypatch.setattr(
        groups_module.time, "monotonic", lambda: now + groups_module.FAILED_GROUP_SECONDS + 1
    )
    assert groups.pick("t", ["broker-a", "broker-b"]) == other  # pinned where it moved


def test_groups_seen_first_grow_the_generation_and_gone_groups_stay_known() -> None:
    groups = BrokerGroups()
    assert groups.update(cluster("broker-a")) == ["broker-a"]
    generation = groups.generation
    assert groups.update(cluster("broker-a")) == []
    assert groups.generation == generation
    assert groups.update(cluster("broker-a", "broker-b")) == ["broker-b"]
    assert groups.generation == generation + 1
    groups.update(cluster("broker-a"))
    assert groups.names() == ["broker-a", "broker-b"]
    assert groups.registered("broker-a") and not groups.registered("broker-b")
    assert groups.update(cluster("broker-a", "broker-b")) == []  # back: not new


def test_a_group_is_read_on_its_master_else_on_its_slave() -> None:
    both = BrokerInfo("broker-a", "c", {"0": "m:1", "1": "s:1", "2": "s:2"})
    assert both.read_addr == "m:1"
    assert BrokerInfo("broker-a", "c", {"2": "s:2", "1": "s:1"}).read_addr == "s:1"
    assert BrokerInfo("broker-a", "c", {}).read_addr is None


def test_colliding_seq_tags_are_reported() -> None:
    groups = BrokerGroups()
    groups.update(cluster("broker-a", "broker-b"))
    assert groups.tag_collisions() == []
    groups.tags["broker-b"] = groups.tags["broker-a"]
    assert groups.tag_collisions() == [("broker-a", "broker-b")]
