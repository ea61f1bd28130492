"""The pure rate-limit room (`bridge.access.ratelimit`): the token bucket and its debt, a client's
publish pacer, the rules of the limits an operator changes at run time (and the configuration's
use of them), the log throttle; and the WebSocket origin allow-list (`bridge.listeners.origins`).
Property tests drive the bucket with arbitrary takes and clocks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.access.ratelimit import (
    LIMIT_NAMES,
    LimitError,
    Limits,
    LogThrottle,
    PublishPacer,
    TokenBucket,
    bucket_for,
    check_limit,
    parse_changes,
    parse_overrides,
)
from bridge.checks import load_config
from bridge.config import ConfigError
from bridge.listeners.origins import OriginError, OriginPolicy, host_of, normalize_origin

# -- the token bucket --------------------------------------------------------------------------


def test_a_full_bucket_gives_its_burst_at_once_then_one_rate_a_second() -> None:
    bucket = TokenBucket(rate=10, burst=10, now=0.0)
    assert bucket.take(10, 0.0) == 0.0
    assert bucket.take(1, 0.0) == pytest.approx(0.1)  # in debt by one token: 0.1 s
    assert bucket.wait(0.05) == pytest.approx(0.05)
    assert bucket.wait(0.1) == 0.0
    assert bucket.take(1, 0.2) == 0.0  # refilled one, used it


def test_a_bucket_never_saves_more_than_its_burst() -> None:
    bucket = TokenBucket(rate=5, burst=5, now=0.0)
    assert bucket.take(5, 1000.0) == 0.0
    assert bucket.take(1, 1000.0) == pytest.approx(0.2)


def test_a_large_take_goes_into_debt_instead_of_waiting_for_ever() -> None:
    bucket = TokenBucket(rate=100, burst=100, now=0.0)
    assert bucket.take(1000, 0.0) == pytest.approx(9.0)  # 900 in debt at 100/s


def test_reserve_takes_only_within_the_wait_it_is_allowed() -> None:
    bucket = TokenBucket(rate=2, burst=2, now=0.0)
    assert bucket.reserve(1, 0.0, max_wait=0.5) == 0.0
    assert bucket.reserve(1, 0.0, max_wait=0.5) == 0.0
    assert bucket.reserve(1, 0.0, max_wait=0.5) == pytest.approx(0.5)
    assert bucket.reserve(1, 0.0, max_wait=0.5) is None  # would wait 1.0 s: not taken
    assert bucket.reserve(1, 0.0, max_wait=1.0) == pytest.approx(1.0)


def test_a_bucket_needs_a_positive_rate_and_bucket_for_zero_is_none() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0, 1, 0.0)
    assert bucket_for(0, 0.0) is None
    small = bucket_for(0.5, 0.0)
    assert small is not None and small.burst == 1.0  # at least one token


@given(
    rate=st.floats(0.1, 1000),
    steps=st.lists(st.tuples(st.floats(0, 5), st.floats(0.01, 50)), min_size=1, max_size=60),
)
def test_a_client_that_waits_as_told_never_beats_the_rate(
    rate: float, steps: list[tuple[float, float]]
) -> None:
    """Whatever it takes and whenever: if the taker waits what each take says before the next
    one, all it took by time T is at most burst + rate * T + its last take."""
    bucket = TokenBucket(rate, max(rate, 1.0), 0.0)
    now = 0.0
    taken = 0.0
    for pause, amount in steps:
        now += pause
        taken += amount
        wait = bucket.take(amount, now)
        assert wait >= 0
        assert taken <= bucket.burst + rate * now + amount + 1e-6 * taken
        now += wait
        assert bucket.wait(now) <= 1e-9 * max(1.0, now)


@given(rate=st.floats(0.1, 1000), amounts=st.lists(st.floats(0.01, 10), max_size=40))
def test_wait_never_takes_anything(rate: float, amounts: list[float]) -> None:
    bucket = TokenBucket(rate, max(rate, 1.0), 0.0)
    for amount in amounts:
        bucket.take(amount, 0.0)
    before = bucket.wait(0.0)
    assert bucket.wait(0.0) == before
    assert bucket.wait(before) == pytest.approx(0.0, abs=1e-9)


# -- the publish pacer -------------------------------------------------------------------------


def test_no_limits_mean_no_pacer() -> None:
    assert PublishPacer.of(0, 0, 0.0) is None


def test_the_message_rate_counts_publishes_and_the_byte_rate_every_byte() -> None:
    pacer = PublishPacer(messages_per_second=10, bytes_per_second=0, now=0.0)
    assert pacer.charge(publishes=0, size=10_000, now=0.0) == 0.0  # no publishes: free
    assert pacer.charge(publishes=10, size=100, now=0.0) == 0.0
    assert pacer.charge(publishes=5, size=100, now=0.0) == pytest.approx(0.5)
    assert pacer.wait(0.5) == 0.0
    by_bytes = PublishPacer(0, 1000, 0.0)
    assert by_bytes.charge(publishes=0, size=3000, now=0.0) == pytest.approx(2.0)


def test_the_longer_of_the_two_waits_is_the_pause() -> None:
    pacer = PublishPacer(messages_per_second=1, bytes_per_second=100, now=0.0)
    assert pacer.charge(publishes=3, size=150, now=0.0) == pytest.approx(2.0)  # 2 msgs short
    assert pacer.wait(1.0) == pytest.approx(1.0)


# -- the limits and their rules ----------------------------------------------------------------


def test_limits_take_overrides_and_tell_whether_publishes_are_paced() -> None:
    limits = Limits()
    assert not limits.paces_publishes
    paced = limits.overridden({"client_publish_bytes_rate": 4096})
    assert paced.paces_publishes and paced.client_publish_bytes_rate == 4096
    assert set(paced.as_dict()) == set(LIMIT_NAMES)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("client_publish_rate", -1, "0 or more"),
        ("client_publish_rate", math.nan, "finite"),
        ("connection_rate", math.inf, "finite"),
        ("connection_rate_wait", -0.5, "0: no waiting"),
        ("max_connections", 1.5, "whole number"),
        ("client_publish_bytes_rate", "100", "expected a number"),
        ("max_connections", True, "expected a number"),
        ("connection_rate", 1e12, "at most"),
        ("max_conections", 5, "not a limit"),
    ],
)
def test_a_nonsense_limit_is_refused_naming_it(name: str, value: object, message: str) -> None:
    with pytest.raises(LimitError) as raised:
        check_limit(name, value)
    assert str(raised.value).startswith(name) and message in str(raised.value)


def test_valid_limits_come_back_in_their_type() -> None:
    assert check_limit("max_connections", 100.0) == 100
    assert isinstance(check_limit("max_connections", 100.0), int)
    assert check_limit("client_publish_rate", 3) == 3.0
    assert isinstance(check_limit("client_publish_rate", 3), float)
    assert check_limit("connection_rate", 0) == 0.0


def test_a_change_request_is_an_object_naming_limits_with_null_meaning_the_default() -> None:
    assert parse_changes({"client_publish_rate": 5, "max_connections": None}) == {
        "client_publish_rate": 5.0,
        "max_connections": None,
    }
    for bad in ([], "x", None, {}, {"nope": None}, {"client_publish_rate": "5"}):
        with pytest.raises(LimitError):
            parse_changes(bad)


def test_stored_overrides_that_break_the_rules_are_skipped_and_named() -> None:
    valid, faults = parse_overrides({"client_publish_rate": 5, "max_connections": -1, "x": 1})
    assert valid == {"client_publish_rate": 5.0}
    assert len(faults) == 2 and any(f.startswith("max_connections") for f in faults)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("client_publish_rate", "-1"),
        ("client_publish_bytes_rate", "1.5"),
        ("connection_rate", "nan"),
        ("connection_rate_wait", "inf"),
        ("max_connections", "-1"),
        ("ws_allowed_origins", "https://console.example/page"),
        ("tls_failure_log_interval", "-3"),
        ("protocol_fault_log_interval", "nan"),
    ],
)
def test_the_configuration_refuses_nonsense_limits_naming_the_option(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(env={}, overrides={name: value})
    assert str(raised.value).startswith(name)


def test_the_configuration_gives_the_default_limits() -> None:
    config = load_config(
        env={},
        overrides={"client_publish_rate": "50", "connection_rate": "20", "max_connections": "9"},
    )
    assert (config.client_publish_rate, config.connection_rate, config.max_connections) == (
        50.0,
        20.0,
        9,
    )


# -- the log throttle --------------------------------------------------------------------------


def test_the_throttle_logs_one_line_per_interval_with_the_count_it_suppressed() -> None:
    throttle = LogThrottle(10.0)
    assert throttle.note(100.0) == (True, 0)
    assert throttle.note(101.0) == (False, 0)
    assert throttle.note(105.0) == (False, 0)
    assert throttle.note(110.0) == (True, 2)
    assert throttle.note(125.0) == (True, 0)


# -- WebSocket origins ---------------------------------------------------------------------------


def test_origins_are_normalized_and_urls_are_not_origins() -> None:
    assert normalize_origin("HTTPS://Console.Example:443") == "https://console.example"
    assert normalize_origin("http://console.example:8080/") == "http://console.example:8080"
    assert normalize_origin("http://[::1]:80") == "http://[::1]"
    for bad in ("console.example", "https://", "https://a.example/x", "ftp://a", "null"):
        with pytest.raises(OriginError):
            normalize_origin(bad)


def test_host_of_drops_the_port_and_ipv6_brackets() -> None:
    assert host_of("Broker.Example:8083") == "broker.example"
    assert host_of("[::1]:8083") == "::1"
    assert host_of("::1") == "::1"
    assert host_of("10.0.0.1") == "10.0.0.1"


def test_by_default_only_pages_of_the_same_host_and_non_browsers_may_upgrade() -> None:
    policy = OriginPolicy()
    assert policy.allows(None, "broker.example:8083")  # no Origin: not a browser
    assert policy.allows("https://broker.example", "broker.example:8083")
    assert policy.allows("http://broker.example:18083", "BROKER.example:8083")
    assert not policy.allows("https://evil.example", "broker.example:8083")
    assert not policy.allows("null", "broker.example:8083")
    assert not policy.allows("https://broker.example.evil.example", "broker.example")


def test_listed_origins_match_scheme_host_and_port() -> None:
    policy = OriginPolicy(["https://console.example", "http://ops.example:8080"])
    assert policy.allows("https://console.example:443", "broker.example")
    assert not policy.allows("http://console.example", "broker.example")
    assert policy.allows("http://ops.example:8080", "broker.example")
    assert not policy.allows("http://ops.example:8081", "broker.example")
    assert OriginPolicy(["*"]).allows("null", "broker.example")
