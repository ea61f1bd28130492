"""`explain`: the console's "explain this decision" names the rule the ACL itself decides by,
says what every rule before it did, and points out deny rules that may filter a granted
subscription's deliveries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.access.acl import PUBLISH, SUBSCRIBE, Acl, Decision, Rule, parse_rules
from bridge.access.explain import (
    DECIDES,
    NO_MATCH,
    NO_SUBSTITUTION,
    NOT_REACHED,
    OTHER_ACTION,
    OTHER_CLIENT,
    Explanation,
    explain,
)

RULES = parse_rules(
    """
    allow user:admin all       #
    deny  all        subscribe secret/#
    allow all        publish   devices/%c/telemetry
    allow all        all       users/%u/#
    allow all        subscribe #
    """.splitlines(),
    "acl.conf",
)


def test_acl_off_allows_with_no_steps() -> None:
    answer = explain(None, PUBLISH, "c", None, "any/topic")
    assert (answer.enabled, answer.allowed, answer.steps) == (False, True, [])


def test_each_rule_before_the_deciding_one_says_why_it_did_not_apply() -> None:
    answer = explain(RULES, PUBLISH, "dev1", None, "devices/dev1/telemetry")
    assert answer.allowed and answer.deciding == 2
    assert [s.outcome for s in answer.steps] == [
        OTHER_CLIENT,
        OTHER_ACTION,
        DECIDES,
        NOT_REACHED,
        NOT_REACHED,
    ]
    assert answer.steps[2].pattern == "devices/dev1/telemetry"
    assert answer.reason == "allowed by rule 3 (acl.conf:4): allow all publish devices/%c/telemetry"


def test_no_applying_rule_denies_and_a_missing_username_cannot_be_substituted() -> None:
    answer = explain(RULES, PUBLISH, "dev1", None, "users/bob/x")
    assert not answer.allowed and answer.deciding is None
    assert answer.reason == "no rule applies: denied"
    assert answer.steps[3].outcome == NO_SUBSTITUTION and answer.steps[2].outcome == NO_MATCH


def test_a_granted_subscription_names_the_deny_rules_that_may_filter_its_deliveries() -> None:
    answer = explain(RULES, SUBSCRIBE, "dev1", None, "#")
    assert answer.allowed and answer.deciding == 4
    assert answer.may_filter == [1]
    refused = explain(RULES, SUBSCRIBE, "dev1", None, "secret/plans")
    assert not refused.allowed and refused.deciding == 1 and refused.may_filter == []


def test_an_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="action"):
        explain(RULES, "read", "c", None, "t")


LEVELS = ("a", "b", "%c", "%u", "$SYS")
WHO = ("all", "anonymous", "user:u1", "client:c1")


@st.composite
def rules(draw: st.DrawFn) -> list[Rule]:
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        levels = draw(st.lists(st.sampled_from((*LEVELS, "+")), min_size=1, max_size=3))
        if draw(st.booleans()):
            levels.append("#")
        decision = draw(st.sampled_from(("allow", "deny")))
        who = draw(st.sampled_from(WHO))
        action = draw(st.sampled_from(("publish", "subscribe", "all")))
        lines.append(f"{decision} {who} {action} {'/'.join(levels)}")
    return parse_rules(lines, "drawn")


@settings(max_examples=300, deadline=None)
@given(
    rules(),
    st.sampled_from((PUBLISH, SUBSCRIBE)),
    st.sampled_from(("c1", "c2")),
    st.sampled_from((None, "u1", "u2")),
    st.lists(st.sampled_from(("a", "b", "c1", "u1", "$SYS")), min_size=1, max_size=3),
    st.sampled_from(("", "/+", "/#")),
)
def test_the_explanation_agrees_with_the_acl(
    drawn: list[Rule],
    action: str,
    client_id: str,
    username: str | None,
    levels: list[str],
    wildcard: str,
) -> None:
    topic = "/".join(levels) + (wildcard if action == SUBSCRIBE else "")
    answer = explain(drawn, action, client_id, username, topic)
    assert answer.allowed == Acl(drawn).decide(action, client_id, username, topic)
    deciding = [i for i, s in enumerate(answer.steps) if s.outcome == DECIDES]
    assert deciding == ([] if answer.deciding is None else [answer.deciding])


def test_acl_off_explains_itself_and_refuses_client_events_when_users_are_configured() -> None:
    allowed = Explanation(False, True, None, [], "ACL off: every request is allowed", [])
    refused = Explanation(
        False,
        False,
        None,
        [],
        "ACL off with users configured: the $SYS client events are refused",
        [],
    )
    assert explain(None, SUBSCRIBE, "c", "u", "$SYS/#", private_client_events=True) == refused
    for action, topic, private in (
        (SUBSCRIBE, "$SYS/#", False),  # the default: client events are not private
        (PUBLISH, "$SYS/#", True),
        (SUBSCRIBE, "a/b", True),
    ):
        assert explain(None, action, "c", "u", topic, private_client_events=private) == allowed
    assert explain(None, SUBSCRIBE, "c", "u", "$SYS/#") == allowed


def test_an_explanation_names_its_rule_with_or_without_a_source_and_the_user_it_applies_to() -> (
    None
):
    rules = parse_rules(["deny user:bob subscribe a/#", "allow all subscribe #"], "acl")
    for_bob = explain(rules, SUBSCRIBE, "c", "bob", "#")
    assert (for_bob.enabled, for_bob.allowed, for_bob.deciding) == (True, True, 1)
    assert for_bob.reason == "allowed by rule 2 (acl:2): allow all subscribe #"
    assert for_bob.may_filter == [0]
    assert explain(rules, SUBSCRIBE, "c", "ann", "#").may_filter == []
    assert explain(rules, SUBSCRIBE, "c", "bob", "a/b").reason == (
        "denied by rule 1 (acl:1): deny user:bob subscribe a/#"
    )
    unsourced = [Rule(Decision.ALLOW, "all", SUBSCRIBE, "users/%u/#")]
    answer = explain(unsourced, SUBSCRIBE, "c", "bob", "users/bob/x")
    assert answer.reason == "allowed by rule 1: allow all subscribe users/%u/#"
    assert answer.steps[0].pattern == "users/bob/#"
    denied = explain(unsourced, SUBSCRIBE, "c", None, "users/bob/x")
    assert denied == Explanation(True, False, None, denied.steps, "no rule applies: denied", [])
    assert [step.outcome for step in denied.steps] == [NO_SUBSTITUTION]
