"""ACL rules: parsing, %c/%u substitution, filter coverage and overlap, first match, the cache."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings

from bridge.access.acl import (
    PUBLISH,
    SUBSCRIBE,
    Acl,
    AclError,
    covers,
    overlaps,
    parse_rule,
    parse_rules,
    substitute,
)
from bridge.mqtt.topics import topic_matches
from tests.support.topic_world import WORLD, filters

RULES = """
# decision who action filter
allow user:admin   all        #
deny  all          subscribe  secret/#
allow all          publish    devices/%c/telemetry
allow all          subscribe  devices/%c/cmd
allow user:alice   all        sensors/%u/#
allow anonymous    subscribe  public/+
deny  client:bad   all        #
allow all          subscribe  shared/#
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def acl():
    return Acl(parse_rules(RULES.splitlines(), "acl"), clock=Clock())


def test_no_rules_allows_everything():
    acl = Acl(None)
    assert not acl.enabled
    assert acl.allows(PUBLISH, "c", None, "any/topic")
    assert acl.allows(SUBSCRIBE, "c", None, "#")


def test_clientid_and_username_substitution(acl):
    assert acl.allows(PUBLISH, "dev1", None, "devices/dev1/telemetry")
    assert not acl.allows(PUBLISH, "dev1", None, "devices/dev2/telemetry")
    assert acl.allows(SUBSCRIBE, "dev1", "u", "devices/dev1/cmd")
    assert not acl.allows(SUBSCRIBE, "dev1", "u", "devices/+/cmd")
    assert acl.allows(PUBLISH, "x", "alice", "sensors/alice/t1")
    assert acl.allows(SUBSCRIBE, "x", "alice", "sensors/alice/+/temp")
    assert not acl.allows(PUBLISH, "x", "bob", "sensors/bob/t1")  # the rule names alice


def test_wildcards_in_an_identity_never_widen_a_rule(acl):
    assert substitute("devices/%c/cmd", "+", None) is None
    assert substitute("devices/%c/cmd", "#", None) is None
    assert substitute("sensors/%u/#", "c", None) is None  # no user name
    assert substitute("sensors/%u/#", "c", "") is None
    assert substitute("a/%c/%u", "c1", "u1") == "a/c1/u1"
    assert not acl.allows(SUBSCRIBE, "#", None, "devices/#")
    assert not acl.allows(PUBLISH, "+", None, "devices/x/telemetry")


def test_first_applying_rule_wins_and_no_match_denies(acl):
    assert acl.allows(SUBSCRIBE, "c", "admin", "secret/x")  # admin's rule comes first
    assert not acl.allows(SUBSCRIBE, "c", "bob", "secret/x")
    assert not acl.allows(SUBSCRIBE, "c", "bob", "#")  # no allow rule covers it
    assert not acl.allows(PUBLISH, "c", "bob", "unlisted")
    assert not acl.allows(PUBLISH, "c", None, "shared/x")  # the rule is for subscribe only


def test_anonymous_and_client_rules(acl):
    assert acl.allows(SUBSCRIBE, "c", None, "public/news")
    assert not acl.allows(SUBSCRIBE, "c", "someone", "public/news")
    # "bad" may publish its telemetry (that rule comes first) but nothing the deny catches.
    assert acl.allows(PUBLISH, "bad", None, "devices/bad/telemetry")
    assert not acl.allows(SUBSCRIBE, "bad", None, "shared/x")


def test_a_broader_subscription_past_a_narrower_deny_is_granted():
    acl = Acl(parse_rules(["deny all subscribe a/secret", "allow all subscribe #"], "r"))
    assert acl.subscribe_allowed("c", None, "a/+")
    assert acl.subscribe_allowed("c", None, "#")
    assert not acl.subscribe_allowed("c", None, "a/secret")  # the deny covers it whole
    assert acl.subscribe_allowed("c", None, "a/public")


def test_read_rules_are_the_subscribing_rules_that_apply_to_the_client_filled_in():
    acl = Acl(
        parse_rules(
            [
                "deny user:bob subscribe a/#",
                "deny all publish b/#",
                "allow all all %u/#",
                "allow client:c subscribe c/%c",
            ],
            "r",
        )
    )
    assert acl.read_rules("c", "bob") == [("a/#", False), ("bob/#", True), ("c/c", True)]
    assert acl.read_rules("d", None) == []  # %u cannot be filled in without a user name
    assert Acl(None).read_rules("c", "bob") == []


def test_read_rules_are_worked_out_again_when_the_rules_change():
    acl = Acl(parse_rules(["allow all subscribe a/#"], "r"))
    assert acl.read_rules("c", None) == [("a/#", True)]
    acl.replace(parse_rules(["deny all subscribe a/#"], "r"))
    assert acl.read_rules("c", None) == [("a/#", False)]


def test_wildcard_rules_do_not_reach_dollar_topics():
    acl = Acl(parse_rules(["allow all all #"], "r"))
    assert not acl.allows(SUBSCRIBE, "c", None, "$SYS/#")
    assert not acl.allows(PUBLISH, "c", None, "$SYS/x")
    acl = Acl(parse_rules(["allow all subscribe $SYS/#"], "r"))
    assert acl.allows(SUBSCRIBE, "c", None, "$SYS/brokers/+/clients/#")


def test_cache_expires_and_is_cleared_by_replace():
    clock = Clock()
    acl = Acl(parse_rules(["allow all publish a"], "r"), cache_ttl=10, clock=clock)
    assert acl.allows(PUBLISH, "c", None, "a")
    assert acl.allows(PUBLISH, "c", None, "a")
    assert (acl.cache_hits, acl.cache_misses) == (1, 1)
    acl.replace(parse_rules(["deny all publish a"], "r"))
    assert not acl.allows(PUBLISH, "c", None, "a")  # not hidden by the cached allow
    clock.now += 11
    assert not acl.allows(PUBLISH, "c", None, "a")
    assert acl.cache_misses == 3


def test_cache_is_bounded():
    acl = Acl(parse_rules(["allow all publish #"], "r"), cache_size=3, clock=Clock())
    for index in range(10):
        acl.allows(PUBLISH, "c", None, f"t/{index}")
    assert len(acl._cache) <= 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("allow all publish", "expected"),
        ("permit all publish a", "not allow or deny"),
        ("allow everyone publish a", "not all, anonymous"),
        ("allow user: publish a", "not all, anonymous"),
        ("allow all read a", "not publish, subscribe or all"),
        ("allow all publish a/#/b", "'#' must be a whole last level"),
        ("allow all publish a+/b", "'+' must be a whole level"),
    ],
)
def test_malformed_rule_names_its_place(line, message):
    with pytest.raises(AclError, match=re.escape(message)):
        parse_rules(["# ok", line], "acl.conf")
    with pytest.raises(AclError, match=r"acl\.conf:2"):
        parse_rules(["# ok", line], "acl.conf")


def test_rule_text_round_trips():
    rule = parse_rule("ALLOW user:a SUBSCRIBE x/+/y")
    assert rule is not None
    assert parse_rule(rule.text()) == rule


# -- coverage and overlap against brute force over a finite universe of topics --------------


@settings(max_examples=300, deadline=None)
@given(filters(), filters())
def test_covers_means_every_topic_of_the_request_matches_the_rule(rule, requested):
    expected = all(topic_matches(rule, t) for t in WORLD if topic_matches(requested, t))
    assert covers(rule, requested) == expected


@settings(max_examples=300, deadline=None)
@given(filters(), filters())
def test_overlaps_means_some_topic_matches_both(a, b):
    expected = any(topic_matches(a, t) and topic_matches(b, t) for t in WORLD)
    assert overlaps(a, b) == expected
    assert overlaps(b, a) == expected


def test_with_the_acl_off_client_events_are_private_only_when_asked() -> None:
    private = Acl(None, private_client_events=True)
    assert not private.subscribe_allowed("c", "u", "$SYS/#")
    assert private.subscribe_allowed("c", None, "#")  # '#' never matches a $SYS topic
    assert private.subscribe_allowed("c", "u", "a/b")
    assert Acl(None).subscribe_allowed("c", "u", "$SYS/#")
    ruled = Acl(parse_rules(["allow user:u subscribe $SYS/#"], "acl"), private_client_events=True)
    assert ruled.subscribe_allowed("c", "u", "$SYS/#")
    assert not ruled.subscribe_allowed("c", "v", "$SYS/#")
