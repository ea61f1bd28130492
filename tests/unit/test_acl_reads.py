"""Whether a message may be delivered under the rules on reading (`bridge.access.reads`): no
check while all of a session's filters stay granted, a check per topic once the rules stop
granting one of them or a deny rule applies to the client."""

from __future__ import annotations

from bridge.access.acl import Acl, parse_rules
from bridge.access.reads import may_read
from bridge.session import Session


def acl_of(text: str) -> Acl:
    return Acl(parse_rules(text.splitlines(), "test"))


def alice_reading(*filters: str, shared: tuple[str, ...] = ()) -> Session:
    session = Session("alice-phone", persistent=True)
    for topic_filter in filters:
        session.set_subscription(topic_filter, 1)
    for share_filter in shared:
        session.add_shared(share_filter, 1)
    return session


def test_while_every_filter_is_granted_deliveries_are_cleared_once_per_rule_set() -> None:
    acl = acl_of("allow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert may_read(acl, session, "alice", "alice/bank")
    assert session.reads_cleared == acl.generation
    misses = acl.cache_misses
    assert may_read(acl, session, "alice", "alice/other")
    assert acl.cache_misses == misses  # the cleared session asked the rules nothing


def test_a_filter_the_new_rules_no_longer_grant_stops_delivering_its_topics() -> None:
    acl = acl_of("allow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert may_read(acl, session, "alice", "alice/bank")
    acl.replace(parse_rules(["allow user:alice subscribe alice/public/#"], "test"))
    assert not may_read(acl, session, "alice", "alice/bank")
    assert may_read(acl, session, "alice", "alice/public/news")
    assert session.reads_cleared != acl.generation


def test_a_shared_subscription_is_judged_by_its_inner_filter() -> None:
    acl = acl_of("allow user:alice subscribe jobs/#")
    session = alice_reading(shared=("$share/workers/jobs/#",))
    assert may_read(acl, session, "alice", "jobs/1")
    assert session.reads_cleared == acl.generation
    acl.replace(parse_rules(["allow user:alice subscribe other/#"], "test"))
    assert not may_read(acl, session, "alice", "jobs/2")


def test_a_client_a_deny_rule_applies_to_is_checked_topic_by_topic() -> None:
    acl = acl_of("deny all subscribe alice/secret/#\nallow user:alice all alice/#")
    session = alice_reading("alice/#")
    assert not may_read(acl, session, "alice", "alice/secret/pin")
    assert may_read(acl, session, "alice", "alice/bank")
    assert session.reads_cleared == -1


def test_without_rules_everything_is_delivered() -> None:
    assert may_read(Acl(None), alice_reading("#"), None, "any/topic")
