"""Topic names, topic filters, shared subscriptions and the reference matcher."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import (
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

# --- topic_matches ---------------------------------------------------------------------------

MATCHES = [
    # spec section 4.7.1.2 examples
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/#", "sport/", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/#", "sport/tennis", True),
    ("sport/tennis/#", "sport/tennisx", False),
    # spec section 4.7.1.3 examples
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "finance", True),
    ("+/tennis/#", "sport/tennis/player1", True),
    # '+' matches an empty level
    ("a/+/c", "a//c", True),
    ("+/+/+", "//", True),
    ("a/+", "a/b/c", False),
    ("+/+/+", "a/b", False),
    # literal levels
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a/b/", "a/b", False),
    ("/a", "a", False),
    ("ACCOUNTS", "Accounts", False),
    ("a b/c", "a b/c", True),
    # '$' topics (MQTT-4.7.2-1)
    ("#", "$SYS/broker/clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/broker/clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/+", "$SYS/a", True),
    ("a/#", "a/$b", True),
    ("+/$b", "a/$b", True),
    ("$share", "$share", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_topic_matches_table(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


def test_wildcard_filters_never_match_dollar_topics_MQTT_4_7_2_1() -> None:
    for topic_filter in ("#", "+", "+/#", "+/+", "+/broker"):
        assert not topic_matches(topic_filter, "$SYS/broker")


def _oracle(topic_filter: str, topic: str) -> bool:
    """An independent matcher: translate the filter to a regular expression."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = topic_filter.split("/")
    pattern = ""
    for index, level in enumerate(levels):
        if level == "#":
            pattern = pattern[:-1] + "(/.*)?" if index else ".*"
            break
        pattern += "[^/]*" if level == "+" else re.escape(level)
        if index < len(levels) - 1:
            pattern += "/"
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


_filter_levels = st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=1, max_size=5)
_topic_levels = st.lists(st.sampled_from(["a", "b", "", "$x", "c"]), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(_filter_levels, st.booleans(), _topic_levels)
def test_topic_matches_agrees_with_a_regex_oracle(
    levels: list[str], hash_end: bool, topic_levels: list[str]
) -> None:
    topic_filter = "/".join([*levels, "#"] if hash_end else levels)
    topic = "/".join(topic_levels)
    if not topic:
        topic = "a"
    assert topic_matches(topic_filter, topic) is _oracle(topic_filter, topic)


# --- validate_topic_name ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["a", "/", "a/b", "a//b", "$SYS/x", " ", "caf\u00e9", "\U0001f600"]
)
def test_valid_topic_names_pass(topic: str) -> None:
    validate_topic_name(topic)


def test_empty_topic_name_is_rejected_MQTT_4_7_3_1() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_name("")
    assert info.value.rule == "MQTT-4.7.3-1"


@pytest.mark.parametrize("topic", ["+", "#", "a/+", "a/#", "a+", "a#b"])
def test_topic_name_with_wildcards_is_rejected_MQTT_4_7_1_1(topic: str) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_name(topic)
    assert info.value.rule == "MQTT-4.7.1-1"


def test_topic_name_with_null_is_rejected_MQTT_4_7_3_2() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_name("a\x00b")
    assert info.value.rule == "MQTT-4.7.3-2"


def test_topic_name_over_65535_utf8_bytes_is_rejected_MQTT_4_7_3_3() -> None:
    validate_topic_name("a" * 65535)
    validate_topic_name("\u00e9" * 32767)  # 65534 bytes
    for topic in ("a" * 65536, "\u00e9" * 32768):
        with pytest.raises(MQTTProtocolError) as info:
            validate_topic_name(topic)
        assert info.value.rule == "MQTT-4.7.3-3"


@pytest.mark.parametrize("topic", ["a\ud800", "\udfff/x" * 5000])
def test_topic_name_with_surrogates_is_rejected_MQTT_1_5_3_1(topic: str) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_name(topic)
    assert info.value.rule == "MQTT-1.5.3-1"


# --- validate_topic_filter -------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic_filter",
    [
        "a",
        "#",
        "+",
        "a/#",
        "+/+",
        "/+",
        "+/",
        "a/+/b/#",
        "$SYS/#",
        "//",
        "$share",
        "$share/g/a/#",
        "$share/g/+",
        "$share/group-1/#",
        "$shared/x",
    ],
)
def test_valid_topic_filters_pass(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


def test_empty_topic_filter_is_rejected_MQTT_4_7_3_1() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter("")
    assert info.value.rule == "MQTT-4.7.3-1"


@pytest.mark.parametrize(
    "topic_filter", ["a#", "a/#/b", "#/", "##", "a/b#", "#/#", "$share/g/a/#/b"]
)
def test_hash_not_alone_in_the_last_level_is_rejected_MQTT_4_7_1_2(topic_filter: str) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.rule == "MQTT-4.7.1-2"


@pytest.mark.parametrize("topic_filter", ["a+", "+a", "a/b+/c", "++", "a/++", "$share/g/a+"])
def test_plus_not_occupying_a_whole_level_is_rejected_MQTT_4_7_1_3(topic_filter: str) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.rule == "MQTT-4.7.1-3"


def test_topic_filter_with_null_is_rejected_MQTT_4_7_3_2() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter("a/\x00")
    assert info.value.rule == "MQTT-4.7.3-2"


def test_topic_filter_over_65535_bytes_is_rejected_MQTT_4_7_3_3() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter("a/" * 40000)
    assert info.value.rule == "MQTT-4.7.3-3"


def test_shared_filter_needs_a_share_name_MQTT_4_8_2_1() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter("$share//a")
    assert info.value.rule == "MQTT-4.8.2-1"


@pytest.mark.parametrize("topic_filter", ["$share/g", "$share/g/", "$share/g+/a", "$share/#/a"])
def test_shared_filter_share_name_rules_MQTT_4_8_2_2(topic_filter: str) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.rule == "MQTT-4.8.2-2"


# --- parse_shared ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/g//", ("g", "/")),
        ("a/b", None),
        ("$share", None),
        ("$SHARE/g/a", None),
        ("#", None),
    ],
)
def test_parse_shared_splits_group_and_filter(
    topic_filter: str, expected: tuple[str, str] | None
) -> None:
    assert parse_shared(topic_filter) == expected


def test_parse_shared_rejects_unsplittable_shared_filters() -> None:
    for topic_filter in ("$share/", "$share/g", "$share//a"):
        with pytest.raises(MQTTProtocolError):
            parse_shared(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "answer"),
    [
        ("", "MQTT-4.7.3-1: topic filter must be at least one character long"),
        ("a\x00", "MQTT-4.7.3-2: topic filter must not contain U+0000"),
        ("a/#/b", "MQTT-4.7.1-2: '#' in topic filter 'a/#/b' must be the whole last level"),
        ("a/b+", "MQTT-4.7.1-3: '+' in topic filter 'a/b+' must occupy a whole level"),
        ("$share//a", "MQTT-4.8.2-1: shared subscription '$share//a' needs a non-empty share name"),
        ("$share/g", "MQTT-4.8.2-2: share name in '$share/g' must be followed by '/' and a topic"),
        ("$share/g+/a", "MQTT-4.8.2-2: share name 'g+' must not contain '/', '+' or '#'"),
        ("$share/g/", "MQTT-4.8.2-2: shared subscription '$share/g/' must end in a topic filter"),
    ],
)
def test_a_refused_topic_filter_names_the_rule_and_the_filter(
    topic_filter: str, answer: str
) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert str(info.value).startswith(answer)
