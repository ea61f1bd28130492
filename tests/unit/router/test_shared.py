"""Shared subscriptions: round-robin picking in a SharedGroup, matching in SharedSubscriptions."""

from __future__ import annotations

from collections import Counter

import pytest

from bridge.router.shared import SharedGroup, SharedSubscriptions


def group_of(*members: str) -> SharedGroup:
    group = SharedGroup("g", "t/#")
    for member in members:
        group.add(member, 1)
    return group


def picks(group: SharedGroup, n: int) -> list[str | None]:
    return [group.pick() for _ in range(n)]


# -- SharedGroup ------------------------------------------------------------------------------


def test_round_robin_follows_join_order() -> None:
    group = group_of("a", "b", "c")
    assert picks(group, 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_is_exactly_fair_over_300_picks() -> None:
    group = group_of("a", "b", "c")
    assert Counter(picks(group, 300)) == {"a": 100, "b": 100, "c": 100}


def test_empty_group_picks_none() -> None:
    assert SharedGroup().pick() is None


def test_pick_skips_ineligible_members() -> None:
    group = group_of("a", "b", "c")
    offline = {"b"}
    got = [group.pick(lambda m: m not in offline) for _ in range(4)]
    assert got == ["a", "c", "a", "c"]


def test_pick_returns_none_when_nobody_is_eligible() -> None:
    group = group_of("a", "b")
    assert group.pick(lambda m: False) is None
    # and the rotation is unchanged afterwards
    assert picks(group, 2) == ["a", "b"]


def test_skipped_member_keeps_its_place_when_eligible_again() -> None:
    group = group_of("a", "b", "c")
    assert group.pick() == "a"
    assert group.pick(lambda m: m != "b") == "c"
    assert picks(group, 3) == ["a", "b", "c"]


def test_eligible_is_called_only_until_a_pick() -> None:
    group = group_of("a", "b", "c")
    asked: list[str] = []

    def eligible(member: str) -> bool:
        asked.append(member)
        return member == "b"

    assert group.pick(eligible) == "b"
    assert asked == ["a", "b"]


def test_member_joining_mid_round_gets_turn_at_end_of_round() -> None:
    group = group_of("a", "b", "c")
    assert picks(group, 2) == ["a", "b"]
    group.add("d", 0)
    assert picks(group, 5) == ["c", "d", "a", "b", "c"]


def test_member_joining_after_full_round_is_next() -> None:
    group = group_of("a", "b")
    assert picks(group, 2) == ["a", "b"]
    group.add("c", 0)
    assert picks(group, 3) == ["c", "a", "b"]


def test_leave_before_cursor_does_not_skip_anyone() -> None:
    group = group_of("a", "b", "c", "d")
    assert picks(group, 2) == ["a", "b"]
    assert group.remove("a") is True
    assert picks(group, 4) == ["c", "d", "b", "c"]


def test_leave_of_member_just_picked() -> None:
    group = group_of("a", "b", "c")
    assert group.pick() == "a"
    group.remove("a")
    assert picks(group, 3) == ["b", "c", "b"]


def test_leave_of_next_member_moves_on_to_following() -> None:
    group = group_of("a", "b", "c")
    assert group.pick() == "a"
    group.remove("b")
    assert picks(group, 3) == ["c", "a", "c"]


def test_leave_of_last_member_when_cursor_at_end_wraps() -> None:
    group = group_of("a", "b", "c")
    assert picks(group, 2) == ["a", "b"]
    group.remove("c")
    assert picks(group, 3) == ["a", "b", "a"]


def test_fairness_with_churn() -> None:
    group = group_of("a", "b", "c")
    counts: Counter[str | None] = Counter(picks(group, 30))
    group.remove("b")
    group.add("b", 0)  # rejoins at the end of the rotation
    counts.update(picks(group, 30))
    assert counts == {"a": 20, "b": 20, "c": 20}


def test_add_existing_member_updates_qos_without_moving_it() -> None:
    group = group_of("a", "b")
    assert group.add("a", 2) is False
    assert group.members == {"a": 2, "b": 1}
    assert list(group) == ["a", "b"]
    assert picks(group, 2) == ["a", "b"]


def test_remove_unknown_member_is_false() -> None:
    group = group_of("a")
    assert group.remove("zz") is False
    assert len(group) == 1


def test_members_is_a_read_only_live_view() -> None:
    group = group_of("a")
    members = group.members
    group.add("b", 2)
    assert dict(members) == {"a": 1, "b": 2}
    with pytest.raises(TypeError):
        members["c"] = 0  # type: ignore[index]


def test_len_and_contains() -> None:
    group = group_of("a", "b")
    assert len(group) == 2
    assert "a" in group
    group.remove("a")
    assert "a" not in group
    assert len(group) == 1


# -- SharedSubscriptions ----------------------------------------------------------------------


def keys(shared: SharedSubscriptions, topic: str) -> set[str]:
    return {key for key, _group in shared.match(topic)}


def test_subscribe_creates_group_and_reports_new_membership() -> None:
    shared = SharedSubscriptions()
    assert shared.subscribe("$share/g/a/+", "g", "a/+", "c1", 1) is True
    assert shared.subscribe("$share/g/a/+", "g", "a/+", "c2", 0) is True
    assert shared.subscribe("$share/g/a/+", "g", "a/+", "c1", 2) is False
    group = shared.group("$share/g/a/+")
    assert group is not None
    assert group.group == "g"
    assert group.topic_filter == "a/+"
    assert group.members == {"c1": 2, "c2": 0}
    assert len(shared) == 1
    assert "$share/g/a/+" in shared


def test_match_returns_every_matching_group_once() -> None:
    shared = SharedSubscriptions()
    shared.subscribe("$share/g1/a/+", "g1", "a/+", "c1", 0)
    shared.subscribe("$share/g1/a/+", "g1", "a/+", "c2", 0)
    shared.subscribe("$share/g2/a/+", "g2", "a/+", "c3", 0)
    shared.subscribe("$share/g1/a/#", "g1", "a/#", "c1", 0)
    shared.subscribe("$share/g1/b", "g1", "b", "c1", 0)
    result = shared.match("a/x")
    assert sorted(key for key, _ in result) == ["$share/g1/a/#", "$share/g1/a/+", "$share/g2/a/+"]
    for key, group in result:
        assert shared.group(key) is group
    assert keys(shared, "a") == {"$share/g1/a/#"}
    assert keys(shared, "c") == set()


@pytest.mark.parametrize(
    ("inner", "topic", "expected"),
    [
        pytest.param("#", "$SYS/x", False, id="MQTT-4.7.2-1-shared-hash-not-dollar"),
        pytest.param("+/x", "$SYS/x", False, id="MQTT-4.7.2-1-shared-plus-not-dollar"),
        pytest.param("$SYS/#", "$SYS/x", True, id="MQTT-4.7.2-1-shared-dollar-filter-matches"),
        pytest.param("#", "a/b", True, id="MQTT-4.7.1-2-shared-hash-matches"),
        pytest.param("a/#", "a", True, id="MQTT-4.7.1-2-shared-hash-matches-parent"),
        pytest.param("a/+/b", "a//b", True, id="MQTT-4.7.1-3-shared-plus-matches-empty"),
    ],
)
def test_shared_filter_matching_rules(inner: str, topic: str, expected: bool) -> None:
    shared = SharedSubscriptions()
    key = f"$share/g/{inner}"
    shared.subscribe(key, "g", inner, "c1", 1)
    assert (keys(shared, topic) == {key}) is expected


def test_unsubscribe_last_member_drops_group_and_stops_matching() -> None:
    shared = SharedSubscriptions()
    shared.subscribe("$share/g/a", "g", "a", "c1", 0)
    shared.subscribe("$share/g/a", "g", "a", "c2", 0)
    assert keys(shared, "a") == {"$share/g/a"}
    assert shared.unsubscribe("$share/g/a", "c1") is True
    assert keys(shared, "a") == {"$share/g/a"}
    assert shared.unsubscribe("$share/g/a", "c2") is True
    assert shared.group("$share/g/a") is None
    assert shared.match("a") == []
    assert len(shared) == 0


def test_unsubscribe_unknown_is_false() -> None:
    shared = SharedSubscriptions()
    assert shared.unsubscribe("$share/g/a", "c1") is False
    shared.subscribe("$share/g/a", "g", "a", "c1", 0)
    assert shared.unsubscribe("$share/g/a", "c2") is False
    assert shared.group("$share/g/a") is not None


def test_resubscribe_after_group_dropped() -> None:
    shared = SharedSubscriptions()
    shared.subscribe("$share/g/a", "g", "a", "c1", 0)
    shared.unsubscribe("$share/g/a", "c1")
    shared.subscribe("$share/g/a", "g", "a", "c2", 1)
    assert [(k, dict(g.members)) for k, g in shared.match("a")] == [("$share/g/a", {"c2": 1})]


def test_group_rotation_through_the_table() -> None:
    shared = SharedSubscriptions()
    for member in ("c1", "c2", "c3"):
        shared.subscribe("$share/g/t/+", "g", "t/+", member, 1)
    delivered = []
    for i in range(6):
        [(_key, group)] = shared.match(f"t/{i}")
        delivered.append(group.pick())
    assert delivered == ["c1", "c2", "c3", "c1", "c2", "c3"]


def test_conflicting_registration_of_a_share_key_is_rejected() -> None:
    shared = SharedSubscriptions()
    shared.subscribe("$share/g/a", "g", "a", "c1", 0)
    with pytest.raises(
        ValueError, match=r"registered for group 'g' and filter 'a', not 'g' and 'b'"
    ):
        shared.subscribe("$share/g/a", "g", "b", "c2", 0)


def test_groups_lists_every_group() -> None:
    shared = SharedSubscriptions(cache_size=0)
    shared.subscribe("$share/g/a", "g", "a", "c1", 0)
    shared.subscribe("$share/h/a", "h", "a", "c1", 0)
    assert sorted(k for k, _ in shared.groups()) == ["$share/g/a", "$share/h/a"]
