"""The `$delayed/<seconds>/<topic>` form (`bridge.mqtt.delayed`) and the broker timer rounding."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bridge.checks import check_config
from bridge.config import Config, ConfigError
from bridge.mqtt.delayed import DelayedTopic, DelayedTopicError, is_delayed, parse_delayed
from bridge.mqtt.reasons import ReasonCode
from bridge.storage.rocketmq.mapping import TIMER_PRECISION_MS, timer_deliver_ms

TOPIC_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#")


def test_well_formed_delayed_topics_give_the_delay_and_the_target() -> None:
    assert parse_delayed("$delayed/10/factory/alarm") == DelayedTopic(10, "factory/alarm")
    assert parse_delayed("$delayed/0/t") == DelayedTopic(0, "t")
    assert parse_delayed("$delayed/5//leading-empty-level") == DelayedTopic(
        5, "/leading-empty-level"
    )
    assert parse_delayed("$delayed/007/t/") == DelayedTopic(7, "t/")


def test_other_topics_are_not_delayed() -> None:
    for topic in ("factory/alarm", "$SYS/x", "$delayedx/1/t", "delayed/1/t", "$share/g/t"):
        assert parse_delayed(topic) is None
        assert not is_delayed(topic)


@pytest.mark.parametrize(
    "topic",
    [
        "$delayed",
        "$delayed/",
        "$delayed/10",
        "$delayed/10/",
        "$delayed/abc/t",
        "$delayed/-5/t",
        "$delayed/+5/t",
        "$delayed/1.5/t",
        "$delayed/ 5/t",
        "$delayed/5 /t",
        "$delayed/\uff11\uff10/t",  # full-width digits: digits to str.isdigit, not to us
        "$delayed//t",
        "$delayed/10/a/+",
        "$delayed/10/a/#",
        "$delayed/10/$delayed/5/t",
    ],
)
def test_bad_forms_are_refused_as_invalid_topic_names(topic: str) -> None:
    with pytest.raises(DelayedTopicError) as caught:
        parse_delayed(topic, 3600)
    assert caught.value.reason == ReasonCode.TOPIC_NAME_INVALID
    assert caught.value.why


def test_a_delay_over_the_maximum_is_refused_with_implementation_specific_error() -> None:
    assert parse_delayed("$delayed/60/t", 60) == DelayedTopic(60, "t")
    for topic in ("$delayed/61/t", "$delayed/99999999999999999999999/t"):
        with pytest.raises(DelayedTopicError) as caught:
            parse_delayed(topic, 60)
        assert caught.value.reason == ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        assert "delayed_max_seconds=60" in caught.value.why


def test_a_maximum_of_zero_turns_delayed_publish_off() -> None:
    with pytest.raises(DelayedTopicError) as caught:
        parse_delayed("$delayed/1/t", 0)
    assert caught.value.reason == ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
    assert parse_delayed("plain/topic", 0) is None


@settings(max_examples=300)
@given(st.integers(0, 10**6), st.text(TOPIC_CHARS, min_size=1, max_size=30))
def test_any_delay_and_valid_target_round_trips(seconds: int, target: str) -> None:
    assume(not is_delayed(target))  # refused (tested above)
    parsed = parse_delayed(f"$delayed/{seconds}/{target}", 10**6)
    assert parsed == DelayedTopic(seconds, target)


@settings(max_examples=500)
@given(st.text(max_size=40))
def test_any_topic_either_parses_or_raises_the_modules_own_error(tail: str) -> None:
    for topic in (tail, "$delayed/" + tail, "$delayed" + tail):
        try:
            parsed = parse_delayed(topic, 86400)
        except DelayedTopicError as exc:
            assert is_delayed(topic)
            assert exc.reason in (
                ReasonCode.TOPIC_NAME_INVALID,
                ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
            )
            continue
        if parsed is None:
            assert not is_delayed(topic)
        else:
            assert 0 <= parsed.seconds <= 86400
            assert parsed.topic and not is_delayed(parsed.topic)
            assert "+" not in parsed.topic and "#" not in parsed.topic
            assert topic == f"$delayed/{topic.split('/')[1]}/{parsed.topic}"


@given(st.integers(1_000_000_000_000, 3_000_000_000_000))
def test_the_broker_timer_never_delivers_before_the_due_time(due_ms: int) -> None:
    # RocketMQ 5.3.3 (HookUtils.transformTimerMessage) rounds TIMER_DELIVER_MS down to its
    # precision, and a whole multiple one step further down.
    asked = timer_deliver_ms(due_ms)
    fires = asked - TIMER_PRECISION_MS if asked % TIMER_PRECISION_MS == 0 else asked
    fires = fires // TIMER_PRECISION_MS * TIMER_PRECISION_MS
    assert due_ms <= fires < due_ms + TIMER_PRECISION_MS


def test_delayed_settings_are_checked() -> None:
    check_config(Config(delayed_max_seconds=0))
    for bad in (Config(delayed_max_seconds=-1), Config(delayed_max_pending=0)):
        with pytest.raises(ConfigError):
            check_config(bad)


@pytest.mark.parametrize(
    ("topic", "maximum", "answer"),
    [
        ("$delayed/1/t", 0, "0x83 delayed publish is off (delayed_max_seconds=0)"),
        ("$delayed/x/t", 1, "0x90 a delayed publish needs `$delayed/<seconds>/<topic>` with whole"),
        ("$delayed/5", 1, "0x90 a delayed publish needs a topic after `$delayed/<seconds>/`"),
        ("$delayed/5/", 1, "0x90 a delayed publish needs a topic after `$delayed/<seconds>/`"),
        ("$delayed/2/t", 1, "0x83 delay of 2 seconds is over delayed_max_seconds=1"),
        ("$delayed/12345678901234/t", None, "0x83 delay of 123456789012 seconds is over"),
        ("$delayed/1/a\x00", 1, "0x90 the topic of a delayed publish must not contain wildcards"),
        ("$delayed/1/$delayed/1/t", 1, "0x90 a delayed publish cannot target another $delayed"),
    ],
)
def test_a_refused_delayed_topic_says_why_with_its_reason_code(
    topic: str, maximum: int | None, answer: str
) -> None:
    with pytest.raises(DelayedTopicError) as caught:
        parse_delayed(topic, maximum)
    assert caught.value.args == (caught.value.why,)
    assert f"0x{caught.value.reason:02X} {caught.value.why}".startswith(answer)


def test_the_longest_delay_has_ten_digits_and_a_maximum_of_one_second_is_not_off() -> None:
    assert parse_delayed("$delayed/9999999999/t") == DelayedTopic(9_999_999_999, "t")
    assert parse_delayed("$delayed/0000000001/t", 1) == DelayedTopic(1, "t")
