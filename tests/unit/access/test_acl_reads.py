"""Whether a message may be delivered under the rules on reading (`bridge.access.reads`): one
answer per filter where the rules give every topic below it the same one (checked against a
brute force over a finite universe of topics), no check while every filter of a session is
wholly readable, a kept verdict per topic otherwise, and everything judged anew when the rules,
the session's filters or its user name change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.access.acl import SUBSCRIBE, VERDICTS_KEPT, Acl, Decision, Rule, parse_rules
from bridge.access.reads import checks_reads, cleared, filter_verdict, may_read, topic_verdict
from bridge.mqtt.topics import topic_matches
from bridge.session import Session
from tests.support.topic_world import WORLD, filters


def acl_of(text: str) -> Acl:
    return Acl(parse_rules(text.splitlines(), "test"))


def alice_reading(*filters: str, shared: tuple[str, ...] = ()) -> Session:
    session = Session("alice-phone", persistent=True)
    for topic_filter in filters:
        session.set_subscription(topic_filter, 1)
    for share_filter in shared:
        session.add_shared(share_filter, 1)
    return session


def test_while_every_filter_is_wholly_readable_deliveries_are_not_checked() -> None:
    acl = acl_of("allow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert may_read(acl, session, "alice", "alice/bank")
    assert session.reads_judged == acl.generation
    assert session.read_verdicts is None  # nothing is kept per topic


def test_a_deny_rule_sharing_no_topic_with_the_filters_costs_no_check() -> None:
    acl = acl_of("deny all subscribe bench/+/private\nallow all all bench/#")
    session = alice_reading("bench/1/t")
    assert may_read(acl, session, "alice", "bench/1/t")
    assert session.read_verdicts is None


def test_a_filter_the_new_rules_no_longer_grant_stops_delivering_its_topics() -> None:
    acl = acl_of("allow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert may_read(acl, session, "alice", "alice/bank")
    acl.replace(parse_rules(["allow user:alice subscribe alice/public/#"], "test"))
    assert not may_read(acl, session, "alice", "alice/bank")
    assert may_read(acl, session, "alice", "alice/public/news")
    assert session.read_verdicts == {"alice/bank": False, "alice/public/news": True}


def test_rules_granting_the_filter_again_lift_the_checks() -> None:
    acl = acl_of("allow user:alice subscribe alice/public/#")
    session = alice_reading("alice/#")
    assert not may_read(acl, session, "alice", "alice/bank")
    acl.replace(parse_rules(["allow user:alice subscribe alice/#"], "test"))
    assert may_read(acl, session, "alice", "alice/bank")
    assert session.read_verdicts is None


def test_a_shared_subscription_is_judged_by_its_inner_filter() -> None:
    acl = acl_of("allow user:alice subscribe jobs/#")
    session = alice_reading(shared=("$share/workers/jobs/#",))
    assert may_read(acl, session, "alice", "jobs/1")
    assert session.read_verdicts is None
    acl.replace(parse_rules(["allow user:alice subscribe other/#"], "test"))
    assert not may_read(acl, session, "alice", "jobs/2")


def test_a_deny_rule_narrower_than_a_filter_withholds_its_topics_only() -> None:
    acl = acl_of("deny all subscribe alice/secret/#\nallow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert not may_read(acl, session, "alice", "alice/secret/pin")
    assert may_read(acl, session, "alice", "alice/bank")
    assert session.read_verdicts == {"alice/secret/pin": False, "alice/bank": True}


def test_a_filter_added_to_a_session_is_judged_before_its_first_delivery() -> None:
    acl = acl_of("deny all subscribe alice/secret/#\nallow user:alice all alice/#")
    session = alice_reading("alice/public")
    assert may_read(acl, session, "alice", "alice/public")
    assert session.read_verdicts is None
    session.set_subscription("alice/#", 1)
    assert not may_read(acl, session, "alice", "alice/secret/pin")


def test_a_session_resumed_under_another_user_name_is_judged_by_it() -> None:
    acl = acl_of("allow user:alice all alice/#\nallow user:bob subscribe alice/public/#")
    session = alice_reading("alice/#")
    assert may_read(acl, session, "alice", "alice/bank")
    session.reads_judged = -1  # as the node does when a login resumes the session
    assert not may_read(acl, session, "bob", "alice/bank")
    assert may_read(acl, session, "bob", "alice/public/x")


def test_the_verdicts_a_session_keeps_are_bounded() -> None:
    acl = acl_of("deny all subscribe a/secret\nallow all subscribe #")
    session = alice_reading("#")
    for index in range(VERDICTS_KEPT * 2 + 5):
        assert may_read(acl, session, None, f"t/{index}")
    assert session.read_verdicts is not None
    assert len(session.read_verdicts) <= VERDICTS_KEPT
    assert not may_read(acl, session, None, "a/secret")


def test_without_rules_everything_is_delivered() -> None:
    assert may_read(Acl(None), alice_reading("#"), None, "any/topic")


def test_percent_substitutions_are_judged_per_client() -> None:
    acl = acl_of("allow all subscribe devices/%c/#\nallow all subscribe users/%u/#")
    session = alice_reading("devices/alice-phone/#", "users/alice/#")
    assert may_read(acl, session, "alice", "devices/alice-phone/cmd")
    assert session.read_verdicts is None
    other = Session("bob-phone", persistent=True)
    other.set_subscription("devices/alice-phone/#", 1)
    assert not may_read(acl, other, "bob", "devices/alice-phone/cmd")


# -- one answer per filter against brute force over a finite universe of topics -------------


rule_lists = st.lists(st.tuples(filters(), st.booleans()), max_size=5)


@settings(max_examples=400, deadline=None)
@given(rule_lists, filters())
def test_a_filter_verdict_is_the_answer_of_every_topic_below_the_filter(rules, topic_filter):
    verdict = filter_verdict(rules, topic_filter)
    answers = {topic_verdict(rules, t) for t in WORLD if topic_matches(topic_filter, t)}
    if verdict is not None:
        assert answers <= {verdict}


@settings(max_examples=400, deadline=None)
@given(rule_lists, st.sampled_from(WORLD))
def test_a_topic_verdict_is_the_first_matching_rule_or_a_denial(rules, topic):
    expected = next((allow for pattern, allow in rules if topic_matches(pattern, topic)), False)
    assert topic_verdict(rules, topic) == expected


def test_a_filter_the_rules_split_has_no_single_answer() -> None:
    rules = [("a/secret", False), ("#", True)]
    assert filter_verdict(rules, "a/+") is None
    assert filter_verdict(rules, "b/+") is True
    assert filter_verdict(rules, "a/secret") is False
    assert filter_verdict([("a/+", True)], "a/#") is None  # `a` itself matches no rule
    assert filter_verdict([("b/#", True)], "a/#") is False


def test_deliveries_are_cleared_only_once_judged_wholly_readable_under_the_rules_in_force() -> None:
    acl = acl_of("deny all subscribe alice/secret/#\nallow user:alice all alice/#")
    session = alice_reading("alice/public/#")
    assert not cleared(acl, session)  # not judged yet
    assert may_read(acl, session, "alice", "alice/public/x")
    assert cleared(acl, session)
    acl.replace(parse_rules(["allow user:alice all alice/#"], "test"))
    assert not cleared(acl, session)
    session.set_subscription("alice/#", 1)
    assert may_read(acl, session, "alice", "alice/secret/pin")
    assert cleared(acl, session)
    assert cleared(Acl(None), session)
    assert not checks_reads(None, session)  # no ACL
    assert not checks_reads(acl, None)  # no session: nothing is delivered
    acl.replace(parse_rules(["allow user:alice all alice/public/#"], "test"))
    assert checks_reads(acl, session)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), filters()), min_size=1, max_size=5),
    st.lists(filters(), min_size=1, max_size=3),
    st.data(),
)
def test_what_a_session_may_read_is_what_the_rules_decide_for_the_topic(rules, subscribed, data):
    decisions = {True: Decision.ALLOW, False: Decision.DENY}
    acl = Acl([Rule(decisions[allow], "all", SUBSCRIBE, f) for allow, f in rules])
    session = Session("c", persistent=False)
    for topic_filter in subscribed:
        session.set_subscription(topic_filter, 1)
    delivered = [t for t in WORLD if any(topic_matches(f, t) for f in subscribed)]
    for topic in data.draw(st.lists(st.sampled_from(delivered), max_size=8)) if delivered else []:
        assert may_read(acl, session, None, topic) == acl.decide(SUBSCRIBE, "c", None, topic)
