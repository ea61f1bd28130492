"""SubscriptionTrie: matching rules (MQTT section 4.7), bookkeeping, pruning and the match cache."""

from __future__ import annotations

import pytest

from bridge.router.trie import SubscriptionTrie


def matched_filters(trie: SubscriptionTrie, topic: str) -> set[str]:
    return {f for f, _subs in trie.match(topic)}


def single(topic_filter: str) -> SubscriptionTrie:
    trie = SubscriptionTrie()
    trie.subscribe(topic_filter, "c1", 1)
    return trie


# (filter, topic, matches?)
MATCHING_TABLE = [
    # Plain levels.
    pytest.param("a/b/c", "a/b/c", True, id="exact-levels-match"),
    pytest.param("a/b/c", "a/b", False, id="exact-shorter-topic-no-match"),
    pytest.param("a/b", "a/b/c", False, id="exact-longer-topic-no-match"),
    pytest.param("a/b", "a/B", False, id="levels-are-case-sensitive"),
    pytest.param("a/b", "a/b/", False, id="trailing-slash-is-another-level"),
    pytest.param("/a", "/a", True, id="leading-empty-level-matches"),
    pytest.param("/a", "a", False, id="leading-empty-level-is-a-level"),
    # MQTT-4.7.1-2: '#' matches the parent and any number of child levels.
    pytest.param("#", "a", True, id="MQTT-4.7.1-2-hash-alone-matches-one-level"),
    pytest.param("#", "a/b/c", True, id="MQTT-4.7.1-2-hash-alone-matches-many-levels"),
    pytest.param("#", "/", True, id="MQTT-4.7.1-2-hash-alone-matches-empty-levels"),
    pytest.param("a/#", "a", True, id="MQTT-4.7.1-2-hash-matches-parent-level"),
    pytest.param("a/#", "a/", True, id="MQTT-4.7.1-2-hash-matches-empty-child"),
    pytest.param("a/#", "a/b", True, id="MQTT-4.7.1-2-hash-matches-one-child"),
    pytest.param("a/#", "a/b/c/d", True, id="MQTT-4.7.1-2-hash-matches-many-children"),
    pytest.param("a/#", "b", False, id="MQTT-4.7.1-2-hash-needs-its-prefix"),
    pytest.param("a/#", "ab", False, id="MQTT-4.7.1-2-hash-prefix-is-whole-level"),
    pytest.param("a/b/#", "a", False, id="MQTT-4.7.1-2-hash-matches-only-direct-parent"),
    pytest.param("+/#", "a", True, id="MQTT-4.7.1-2-plus-then-hash-matches-one-level"),
    # MQTT-4.7.1-3: '+' matches exactly one level, which may be empty.
    pytest.param("+", "a", True, id="MQTT-4.7.1-3-plus-matches-one-level"),
    pytest.param("+", "a/b", False, id="MQTT-4.7.1-3-plus-matches-only-one-level"),
    pytest.param("+", "", True, id="MQTT-4.7.1-3-plus-matches-empty-topic-level"),
    pytest.param("+", "/a", False, id="MQTT-4.7.1-3-plus-alone-not-two-levels"),
    pytest.param("+/+", "/a", True, id="MQTT-4.7.1-3-plus-matches-leading-empty-level"),
    pytest.param("a/+/b", "a//b", True, id="MQTT-4.7.1-3-plus-matches-empty-level"),
    pytest.param("a/+/b", "a/x/b", True, id="MQTT-4.7.1-3-plus-matches-middle-level"),
    pytest.param("a/+/b", "a/x/y/b", False, id="MQTT-4.7.1-3-plus-not-two-levels"),
    pytest.param("a/+", "a", False, id="MQTT-4.7.1-3-plus-does-not-match-parent"),
    pytest.param("a/+", "a/", True, id="MQTT-4.7.1-3-plus-matches-trailing-empty"),
    pytest.param("+/b/#", "x/b/c/d", True, id="MQTT-4.7.1-3-plus-and-hash-combined"),
    # MQTT-4.7.2-1: a leading wildcard never matches a '$' topic.
    pytest.param("#", "$SYS/x", False, id="MQTT-4.7.2-1-hash-not-dollar-topic"),
    pytest.param("#", "$SYS", False, id="MQTT-4.7.2-1-hash-not-dollar-single-level"),
    pytest.param("+/x", "$SYS/x", False, id="MQTT-4.7.2-1-plus-not-dollar-topic"),
    pytest.param("+", "$SYS", False, id="MQTT-4.7.2-1-plus-not-dollar-single-level"),
    pytest.param("+/#", "$SYS", False, id="MQTT-4.7.2-1-plus-hash-not-dollar-single-level"),
    pytest.param("$SYS/#", "$SYS/x", True, id="MQTT-4.7.2-1-dollar-filter-matches-dollar"),
    pytest.param("$SYS/#", "$SYS", True, id="MQTT-4.7.2-1-dollar-hash-matches-parent"),
    pytest.param("$SYS/+", "$SYS/x", True, id="MQTT-4.7.2-1-dollar-then-plus-matches"),
    pytest.param("$SYS/x", "$SYS/x", True, id="MQTT-4.7.2-1-dollar-exact-matches"),
    pytest.param("a/+", "a/$x", True, id="MQTT-4.7.2-1-dollar-rule-only-first-level"),
    pytest.param("#", "a/$SYS", True, id="MQTT-4.7.2-1-hash-matches-dollar-later-level"),
    pytest.param("#", "x$", True, id="MQTT-4.7.2-1-dollar-not-first-char-is-normal"),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHING_TABLE)
@pytest.mark.parametrize("cache_size", [0, 4096], ids=["nocache", "cache"])
def test_matching_rules(topic_filter: str, topic: str, expected: bool, cache_size: int) -> None:
    trie = SubscriptionTrie(cache_size=cache_size)
    trie.subscribe(topic_filter, "c1", 1)
    for _ in range(2):  # the second round is served from the cache when enabled
        assert (matched_filters(trie, topic) == {topic_filter}) is expected
        assert trie.match_subscribers(topic) == ({"c1": 1} if expected else {})


def test_match_returns_every_matching_filter_with_live_dict() -> None:
    trie = SubscriptionTrie()
    for f in ["a/b", "a/+", "a/#", "#", "+/+", "+/b/#", "a/b/c", "b/+"]:
        trie.subscribe(f, "c1", 0)
    trie.subscribe("a/+", "c2", 2)
    result = dict(trie.match("a/b"))
    assert set(result) == {"a/b", "a/+", "a/#", "#", "+/+", "+/b/#"}
    assert result["a/+"] == {"c1": 0, "c2": 2}


def test_match_without_subscriptions_is_empty() -> None:
    trie = SubscriptionTrie()
    assert trie.match("a") == []
    assert trie.match_subscribers("a") == {}


def test_MQTT_3_3_5_1_overlapping_filters_deliver_once_at_highest_qos() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/#", "c1", 0)
    trie.subscribe("a/+", "c1", 2)
    trie.subscribe("a/b", "c1", 1)
    trie.subscribe("a/b", "c2", 1)
    trie.subscribe("#", "c2", 0)
    trie.subscribe("#", "c3", 0)
    assert trie.match_subscribers("a/b") == {"c1": 2, "c2": 1, "c3": 0}
    assert trie.match_subscribers("a/c") == {"c1": 2, "c2": 0, "c3": 0}
    assert trie.match_subscribers("a") == {"c1": 0, "c2": 0, "c3": 0}


def test_MQTT_3_3_5_1_match_subscribers_returns_a_copy() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a", "c1", 1)
    for _ in range(3):  # computed, then twice from the cache
        got = trie.match_subscribers("a")
        assert got == {"c1": 1}
        got["intruder"] = 2
    assert trie.subscribers("a") == {"c1": 1}


# -- bookkeeping ------------------------------------------------------------------------------


def test_subscribe_returns_true_when_new_false_when_qos_replaced() -> None:
    trie = SubscriptionTrie()
    assert trie.subscribe("a/+", "c1", 0) is True
    assert trie.subscribe("a/+", "c2", 1) is True
    assert trie.subscribe("a/+", "c1", 2) is False
    assert trie.subscribers("a/+") == {"c1": 2, "c2": 1}
    assert len(trie) == 2


def test_len_counts_filter_subscriber_pairs() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a", "c1", 0)
    trie.subscribe("a", "c2", 0)
    trie.subscribe("b", "c1", 0)
    trie.subscribe("b", "c1", 1)
    assert len(trie) == 3
    trie.unsubscribe("a", "c1")
    assert len(trie) == 2


def test_subscribers_of_unknown_filter_is_empty_dict() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    assert trie.subscribers("a") == {}
    assert trie.subscribers("a/b/c") == {}


def test_filters_and_contains_list_only_filters_with_subscribers() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b/c", "c1", 0)
    trie.subscribe("a/#", "c1", 0)
    trie.subscribe("+", "c2", 0)
    assert set(trie.filters()) == {"a/b/c", "a/#", "+"}
    assert "a/b/c" in trie
    assert "a/b" not in trie  # an intermediate node only
    assert "a" not in trie
    trie.unsubscribe("+", "c2")
    assert "+" not in trie
    assert set(trie.filters()) == {"a/b/c", "a/#"}


def test_filters_is_a_snapshot_safe_to_unsubscribe_during() -> None:
    trie = SubscriptionTrie()
    for f in ["a", "b", "c"]:
        trie.subscribe(f, "c1", 0)
    for f in trie.filters():
        trie.unsubscribe(f, "c1")
    assert len(trie) == 0


def test_unsubscribe_returns_whether_it_existed() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    assert trie.unsubscribe("a/b", "c2") is False
    assert trie.unsubscribe("a", "c1") is False
    assert trie.unsubscribe("a/b/c", "c1") is False
    assert trie.unsubscribe("a/b", "c1") is True
    assert trie.unsubscribe("a/b", "c1") is False
    assert len(trie) == 0


def test_clear_removes_everything() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/#", "c1", 0)
    trie.match("a/b")
    trie.clear()
    assert len(trie) == 0
    assert trie.match("a/b") == []
    assert list(trie.filters()) == []


# -- pruning ----------------------------------------------------------------------------------


def node_count(trie: SubscriptionTrie) -> int:
    """Nodes below the root (reaching into internals on purpose)."""
    stack = [trie._root]
    count = -1
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
        stack.extend(n for n in (node.plus, node.hash) if n is not None)
    return count


def test_unsubscribe_prunes_empty_nodes() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/+/c/#", "c1", 0)
    assert node_count(trie) == 4
    trie.unsubscribe("a/+/c/#", "c1")
    assert node_count(trie) == 0
    assert trie._root.is_empty()


def test_unsubscribe_prunes_only_unshared_tail() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    trie.subscribe("a/b/c/d", "c1", 0)
    trie.subscribe("a/+/x", "c1", 0)
    assert node_count(trie) == 6  # a, b, c, d, +, x
    trie.unsubscribe("a/b/c/d", "c1")
    assert node_count(trie) == 4  # a, b, +, x
    assert matched_filters(trie, "a/b") == {"a/b"}
    trie.unsubscribe("a/b", "c1")
    assert node_count(trie) == 3  # a, +, x
    assert matched_filters(trie, "a/z/x") == {"a/+/x"}


def test_unsubscribe_keeps_node_with_other_subscribers() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    trie.subscribe("a/b", "c2", 0)
    trie.unsubscribe("a/b", "c1")
    assert node_count(trie) == 2
    assert trie.match_subscribers("a/b") == {"c2": 0}


def test_resubscribe_after_prune_works() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/#", "c1", 0)
    trie.unsubscribe("a/#", "c1")
    trie.subscribe("a/#", "c1", 2)
    assert trie.match_subscribers("a/x") == {"c1": 2}


# -- the match cache --------------------------------------------------------------------------


def test_cache_invalidated_by_new_filter() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    assert matched_filters(trie, "a/b") == {"a/b"}
    trie.subscribe("a/+", "c2", 1)
    assert matched_filters(trie, "a/b") == {"a/b", "a/+"}
    assert trie.match_subscribers("a/b") == {"c1": 0, "c2": 1}


def test_cache_invalidated_by_unsubscribe_of_last_subscriber() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/b", "c1", 0)
    trie.subscribe("#", "c2", 0)
    assert trie.match_subscribers("a/b") == {"c1": 0, "c2": 0}
    trie.unsubscribe("#", "c2")
    assert matched_filters(trie, "a/b") == {"a/b"}
    assert trie.match_subscribers("a/b") == {"c1": 0}
    trie.unsubscribe("a/b", "c1")
    assert trie.match("a/b") == []


def test_cache_sees_new_subscriber_on_existing_filter() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/+", "c1", 0)
    assert trie.match_subscribers("a/b") == {"c1": 0}
    trie.subscribe("a/+", "c2", 1)
    assert trie.match_subscribers("a/b") == {"c1": 0, "c2": 1}
    trie.unsubscribe("a/+", "c1")
    assert trie.match_subscribers("a/b") == {"c2": 1}


def test_cache_sees_qos_change() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a/+", "c1", 0)
    trie.subscribe("a/#", "c1", 1)
    assert trie.match_subscribers("a/b") == {"c1": 1}
    trie.subscribe("a/+", "c1", 2)
    assert trie.match_subscribers("a/b") == {"c1": 2}
    assert dict(trie.match("a/b"))["a/+"] == {"c1": 2}
    trie.subscribe("a/+", "c1", 0)
    assert trie.match_subscribers("a/b") == {"c1": 1}


def test_cache_is_bounded() -> None:
    trie = SubscriptionTrie(cache_size=8)
    trie.subscribe("#", "c1", 0)
    for i in range(100):
        assert trie.match_subscribers(f"t/{i}") == {"c1": 0}
        assert len(trie._cache) <= 8


def test_cache_disabled_with_size_zero() -> None:
    trie = SubscriptionTrie(cache_size=0)
    trie.subscribe("#", "c1", 0)
    trie.match("a")
    assert trie._cache == {}


def test_negative_cache_size_rejected() -> None:
    with pytest.raises(ValueError):
        SubscriptionTrie(cache_size=-1)


def test_mutating_match_result_list_does_not_corrupt_cache() -> None:
    trie = SubscriptionTrie()
    trie.subscribe("a", "c1", 0)
    trie.match("a").clear()
    assert matched_filters(trie, "a") == {"a"}
