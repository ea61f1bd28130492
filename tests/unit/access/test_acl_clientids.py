"""ClientId prefixes bound to users (`clientid user:NAME PREFIX` in the ACL): parsing, and who
may use which ClientId, checked against a brute-force reading of the rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.access.acl import CLIENTID, Acl, AclError, parse_rule, parse_rules
from bridge.access.clientids import ClientIdPrefixes

RULES = """
clientid  user:alice  alice-
clientid  user:alice  shop-
clientid  user:bob    shop-7-
clientid  user:carol  shared-
clientid  user:dave   shared-
allow all all #
"""


@pytest.fixture
def prefixes() -> ClientIdPrefixes:
    return ClientIdPrefixes(parse_rules(RULES.splitlines(), "acl"))


def test_a_clientid_line_parses_into_a_rule_no_topic_check_applies():
    rule = parse_rule("ClientId user:alice alice-", "acl:1")
    assert rule is not None
    assert (rule.action, rule.who, rule.topic_filter) == (CLIENTID, "user:alice", "alice-")
    assert parse_rule(rule.text()) == parse_rule("clientid user:alice alice-")
    acl = Acl([rule])
    assert not acl.allows("publish", "alice-1", "alice", "alice-")
    assert not acl.allows("subscribe", "alice-1", "alice", "alice-")
    assert acl.read_rules("alice-1", "alice") == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("clientid user:alice", "expected 'clientid user:NAME PREFIX'"),
        ("clientid user:alice a- b-", "expected 'clientid user:NAME PREFIX'"),
        ("clientid all alice-", "bound to a user:NAME"),
        ("clientid user: alice-", "bound to a user:NAME"),
        ("clientid client:x alice-", "bound to a user:NAME"),
        ("clientid user:alice a\x00b", "contains NUL"),
    ],
)
def test_a_malformed_clientid_line_is_refused_naming_the_line(line, message):
    with pytest.raises(AclError, match=r"acl\.conf:2") as caught:
        parse_rules(["# ok", line], "acl.conf")
    assert message in str(caught.value)


def test_a_user_may_use_the_prefixes_bound_to_it_only(prefixes):
    assert prefixes.refusal("alice-phone", "alice") is None
    assert prefixes.refusal("shop-1", "alice") is None
    assert prefixes.refusal("phone", "alice") is not None  # not under one of her prefixes
    assert prefixes.refusal("", "alice") is not None


def test_a_bound_prefix_is_refused_to_every_other_identity(prefixes):
    assert prefixes.refusal("alice-phone", "bob") is not None
    assert prefixes.refusal("alice-phone", None) is not None  # anonymous
    assert prefixes.refusal("alice-phone", "mallory") is not None


def test_the_longest_bound_prefix_decides_whose_a_clientid_is(prefixes):
    assert prefixes.refusal("shop-7-till", "bob") is None
    assert prefixes.refusal("shop-7-till", "alice") is not None
    assert prefixes.refusal("shop-8-till", "alice") is None
    assert prefixes.refusal("shop-8-till", "bob") is not None


def test_a_prefix_bound_to_several_users_is_theirs_alike(prefixes):
    assert prefixes.refusal("shared-1", "carol") is None
    assert prefixes.refusal("shared-1", "dave") is None
    assert prefixes.refusal("shared-1", "erin") is not None


def test_clientids_no_prefix_reserves_stay_free_for_users_without_prefixes(prefixes):
    assert prefixes.refusal("sensor-1", "erin") is None
    assert prefixes.refusal("sensor-1", None) is None


def test_the_refusal_never_names_the_owner(prefixes):
    reason = prefixes.refusal("shop-7-till", "alice")
    assert reason is not None and "bob" not in reason


def test_rules_without_clientid_lines_refuse_no_clientid():
    prefixes = ClientIdPrefixes(parse_rules(["allow all all #"], "acl"))
    assert not prefixes
    assert prefixes.refusal("anything", "alice") is None


# -- against a brute-force reading of the rule ------------------------------------------------

users = st.sampled_from(["alice", "bob", "carol"])
prefixes_drawn = st.text(alphabet="ab-", min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(users, prefixes_drawn), max_size=6),
    st.text(alphabet="ab-", max_size=5),
    st.one_of(st.none(), users),
)
def test_a_clientid_is_refused_exactly_as_the_rule_reads(bindings, client_id, username):
    rules = parse_rules([f"clientid user:{user} {prefix}" for user, prefix in bindings], "r")
    refused = ClientIdPrefixes(rules).refusal(client_id, username) is not None
    matching = [prefix for _user, prefix in bindings if client_id.startswith(prefix)]
    if matching:
        longest = max(matching, key=len)
        owners = {user for user, prefix in bindings if prefix == longest}
        expected = username not in owners
    else:
        expected = username in {user for user, _prefix in bindings}
    assert refused == expected
