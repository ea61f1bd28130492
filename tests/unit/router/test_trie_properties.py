"""SubscriptionTrie against a brute-force matcher, with hypothesis.

The reference keeps every (filter, subscriber) -> qos pair in a flat dict and matches a topic by
comparing it level by level with each filter, written directly from the rules of MQTT section 4.7.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from bridge.router.trie import SubscriptionTrie

LEVELS = ["a", "b", "$SYS", ""]
SUBSCRIBERS = ["c1", "c2", "c3"]

level = st.sampled_from(LEVELS)
filter_level = st.sampled_from([*LEVELS, "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    """A valid filter: 1-4 levels of LEVELS or '+', optionally ending in '#'."""
    levels = draw(st.lists(filter_level, min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


topics = st.lists(level, min_size=1, max_size=5).map("/".join)


def reference_matches(topic_filter: str, topic: str) -> bool:
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    if t_levels[0].startswith("$") and f_levels[0] in ("+", "#"):
        return False  # MQTT-4.7.2-1
    for i, f in enumerate(f_levels):
        if f == "#":
            return True  # the rest, possibly nothing (MQTT-4.7.1-2)
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


def reference_match(pairs: dict[tuple[str, str], int], topic: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic_filter, subscriber), qos in pairs.items():
        if reference_matches(topic_filter, topic):
            out.setdefault(topic_filter, {})[subscriber] = qos
    return out


def reference_match_subscribers(pairs: dict[tuple[str, str], int], topic: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for (topic_filter, subscriber), qos in pairs.items():
        if reference_matches(topic_filter, topic):
            out[subscriber] = max(qos, out.get(subscriber, -1))
    return out


def as_dict(result: list[tuple[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    out = {f: dict(subs) for f, subs in result}
    assert len(out) == len(result), "a filter was reported twice"
    return out


def test_reference_matcher_sanity() -> None:
    assert reference_matches("a/#", "a")
    assert reference_matches("+/+", "/a")
    assert not reference_matches("#", "$SYS/a")
    assert reference_matches("$SYS/#", "$SYS")
    assert not reference_matches("a/+", "a")


@settings(max_examples=150, deadline=None, database=None)
@given(
    subs=st.lists(
        st.tuples(topic_filters(), st.sampled_from(SUBSCRIBERS), st.integers(0, 2)), max_size=25
    ),
    unsubs=st.lists(st.integers(0, 24), max_size=10),
    probe=st.lists(topics, min_size=1, max_size=10),
)
def test_match_equals_brute_force(
    subs: list[tuple[str, str, int]], unsubs: list[int], probe: list[str]
) -> None:
    trie = SubscriptionTrie(cache_size=4)
    pairs: dict[tuple[str, str], int] = {}
    for topic_filter, subscriber, qos in subs:
        trie.subscribe(topic_filter, subscriber, qos)
        pairs[(topic_filter, subscriber)] = qos
    for topic in probe:  # warm the cache before the unsubscribes
        trie.match(topic)
    for index in unsubs:
        if index < len(subs):
            topic_filter, subscriber, _ = subs[index]
            assert trie.unsubscribe(topic_filter, subscriber) == (
                pairs.pop((topic_filter, subscriber), None) is not None
            )
    assert len(trie) == len(pairs)
    for topic in probe:
        assert as_dict(trie.match(topic)) == reference_match(pairs, topic)
        assert trie.match_subscribers(topic) == reference_match_subscribers(pairs, topic)


class TrieMachine(RuleBasedStateMachine):
    """Random subscribe/unsubscribe/match sequences; cached and uncached tries vs the model."""

    subscribed = Bundle("subscribed")

    def __init__(self) -> None:
        super().__init__()
        self.cached = SubscriptionTrie(cache_size=8)
        self.uncached = SubscriptionTrie(cache_size=0)
        self.pairs: dict[tuple[str, str], int] = {}

    @rule(
        target=subscribed,
        topic_filter=topic_filters(),
        subscriber=st.sampled_from(SUBSCRIBERS),
        qos=st.integers(0, 2),
    )
    def subscribe(self, topic_filter: str, subscriber: str, qos: int) -> tuple[str, str]:
        is_new = (topic_filter, subscriber) not in self.pairs
        assert self.cached.subscribe(topic_filter, subscriber, qos) is is_new
        assert self.uncached.subscribe(topic_filter, subscriber, qos) is is_new
        self.pairs[(topic_filter, subscriber)] = qos
        return (topic_filter, subscriber)

    @rule(pair=consumes(subscribed))
    def unsubscribe(self, pair: tuple[str, str]) -> None:
        existed = pair in self.pairs
        assert self.cached.unsubscribe(*pair) is existed
        assert self.uncached.unsubscribe(*pair) is existed
        self.pairs.pop(pair, None)

    @precondition(lambda self: bool(self.pairs))
    @rule(topic_filter=topic_filters(), subscriber=st.sampled_from(SUBSCRIBERS))
    def unsubscribe_maybe_absent(self, topic_filter: str, subscriber: str) -> None:
        existed = (topic_filter, subscriber) in self.pairs
        assert self.cached.unsubscribe(topic_filter, subscriber) is existed
        assert self.uncached.unsubscribe(topic_filter, subscriber) is existed
        self.pairs.pop((topic_filter, subscriber), None)

    @rule(topic=topics)
    def match(self, topic: str) -> None:
        expected = reference_match(self.pairs, topic)
        expected_subs = reference_match_subscribers(self.pairs, topic)
        for trie in (self.cached, self.uncached):
            assert as_dict(trie.match(topic)) == expected
            assert trie.match_subscribers(topic) == expected_subs

    @invariant()
    def bookkeeping(self) -> None:
        filters = {f for f, _ in self.pairs}
        for trie in (self.cached, self.uncached):
            assert len(trie) == len(self.pairs)
            assert set(trie.filters()) == filters
        if not self.pairs:
            assert self.cached._root.is_empty()
            assert self.uncached._root.is_empty()


TrieMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, database=None
)
test_trie_machine = TrieMachine.TestCase
