"""How a message goes out under MQTT 5.0 subscription options (`bridge.node.copies`),
checked against a brute-force reading of the specification: one copy per client, from the filter
with the highest granted QoS that No Local does not exclude, with the identifiers of every
matching filter No Local lets through, RETAIN kept only under Retain As Published."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.topics import topic_matches
from bridge.node.copies import live_copy, stored_copy
from bridge.session import Session, SubOptions

FILTERS = ["a/b", "a/+", "a/#", "#", "+/b", "b/#"]
TOPICS = ["a/b", "a/c", "b/b", "a"]


@st.composite
def sessions(draw: Any) -> Session:
    session = Session("me", persistent=False)
    for topic_filter in draw(st.lists(st.sampled_from(FILTERS), unique=True)):
        session.set_subscription(topic_filter, draw(st.integers(0, 2)))
        option = SubOptions(draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 3)))
        if option != SubOptions():
            session.set_options(topic_filter, option)
    return session


def expected(session: Session, topic: str, publisher: str, retain: bool) -> Any:
    own = publisher == session.client_id
    allowed = [
        f
        for f in session.subscriptions
        if topic_matches(f, topic) and not (own and session.options.get(f, SubOptions()).no_local)
    ]
    if not allowed:
        return None
    best = max(allowed, key=lambda f: (session.subscriptions[f], f))
    ids = sorted({session.options[f].identifier for f in allowed if f in session.options} - {0})
    keep = retain and any(session.options.get(f, SubOptions()).retain_as_published for f in allowed)
    return best, keep, tuple(ids)


@given(sessions(), st.sampled_from(TOPICS), st.sampled_from(["me", "other"]), st.booleans())
def test_stored_copy_matches_the_specification(session, topic, publisher, retain):
    matching = [f for f in session.subscriptions if topic_matches(f, topic)]
    got = stored_copy(session, matching, publisher, retain)
    want = expected(session, topic, publisher, retain)
    if want is None:
        assert got[0] is None
    else:
        assert got == want


@given(sessions(), st.sampled_from(TOPICS), st.sampled_from(["me", "other"]), st.booleans())
def test_live_copy_matches_the_specification(session, topic, publisher, retain):
    if not any(topic_matches(f, topic) for f in session.subscriptions):
        return  # the router sends live copies only to clients with a matching filter
    wanted, keep, ids = live_copy(session, topic, publisher, retain)
    want = expected(session, topic, publisher, retain)
    assert wanted == (want is not None)
    if want is not None:
        assert (keep, ids) == want[1:]


def test_a_client_without_options_gets_the_311_answer():
    session = Session("me", persistent=False, subscriptions={"a/#": 1})
    assert live_copy(session, "a/b", "me", True) == (True, False, ())
    assert stored_copy(session, ["a/#"], "me", True) == ("a/#", False, ())
