"""How a message goes out to one subscriber (`bridge.node.copies`), checked against a brute-force
reading of the specification, as `plan_route` is against a brute-force matcher: one copy per
client, from the filter with the highest granted QoS that No Local does not exclude (of the
client's filter queues a stored message is on, exactly that filter's sends it, MQTT-3.3.5-1), at
the lower of the message's and the granted QoS, with the identifiers of every matching filter No
Local lets through, RETAIN kept only under Retain As Published; every other queue names why it
sends nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.topics import topic_matches
from bridge.node.copies import (
    SKIP_NO_LOCAL,
    SKIP_NOT_SUBSCRIBED,
    SKIP_OTHER_QUEUE,
    copy_for,
    live_copy,
    stored_copy,
)
from bridge.router.queues import client_queue, filter_queue, shared_queue
from bridge.session import Session, SubOptions
from bridge.storage.message import Message
from bridge.storage.metadata import RETAINED_QOS, SUBSCRIPTION_IDS

FILTERS = ["a/b", "a/+", "a/#", "#", "+/b", "b/#"]
TOPICS = ["a/b", "a/c", "b/b", "a"]


class Parts:
    """A store whose queues are cut in parts named `<queue>@<n>` (or not cut at all)."""

    def queue_of_part(self, part: str) -> str | None:
        queue, at, _ = part.rpartition("@")
        return queue if at else None


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


@given(
    sessions(),
    st.sampled_from(TOPICS),
    st.sampled_from(["me", "other"]),
    st.booleans(),
    st.integers(0, 2),
    st.lists(st.sampled_from(FILTERS), unique=True, max_size=2),
    st.booleans(),
)
def test_exactly_one_filter_queue_sends_a_stored_message_as_the_specification_says(
    session, topic, publisher, retain, qos, unsubscribed, in_parts
):
    message = Message(topic, b"x", qos, retain, publisher)
    # The router stored it on the queue of every matching filter subscribed then; some may
    # have been unsubscribed since.
    stored_on = {f for f in session.subscriptions if topic_matches(f, topic)}
    stored_on |= {f for f in unsubscribed if topic_matches(f, topic)}
    for topic_filter in unsubscribed:
        session.drop_subscription(topic_filter)
        session.drop_options(topic_filter)
    names = {f: filter_queue(f) + ("@0" if in_parts else "") for f in sorted(stored_on)}
    parts = list(names.values())
    want = expected(session, topic, publisher, retain)
    senders = []
    for topic_filter in names:
        copy = copy_for(session, filter_queue(topic_filter), message, parts, Parts())
        if topic_filter not in session.subscriptions:
            assert copy.skip == SKIP_NOT_SUBSCRIBED
        elif want is None:
            assert copy.skip == SKIP_NO_LOCAL
        elif topic_filter != want[0]:
            assert copy.skip == SKIP_OTHER_QUEUE
        else:
            assert not copy.skip
            assert copy.qos == min(qos, session.subscriptions[topic_filter])
            assert (copy.retain, copy.sub_ids) == want[1:]
            senders.append(topic_filter)
    assert len(senders) == (0 if want is None or not stored_on else 1)


@given(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 2)), st.sampled_from(["", "3,7"]))
def test_a_message_on_the_clients_own_queue_carries_the_qos_and_identifiers_it_was_queued_with(
    qos, granted, ids
):
    properties = {}
    if granted is not None:
        properties[RETAINED_QOS] = str(granted)
    if ids:
        properties[SUBSCRIPTION_IDS] = ids
    message = Message("a/b", b"x", qos, True, "other", properties=properties)
    copy = copy_for(Session("me", persistent=False), client_queue("me"), message, [], Parts())
    assert not copy.skip
    assert copy.qos == (qos if granted is None else min(qos, granted))
    assert copy.retain is (granted is not None)  # a retained copy queued at SUBSCRIBE
    assert copy.sub_ids == ((3, 7) if ids else ())


@given(
    st.integers(0, 2),
    st.one_of(st.none(), st.integers(0, 2)),
    st.booleans(),
    st.booleans(),
    st.integers(0, 3),
)
def test_a_shared_queue_sends_at_the_granted_qos_with_its_subscription_options(
    qos, granted, retain, retain_as_published, identifier
):
    share = "$share/g/a/#"
    session = Session("me", persistent=False)
    if granted is not None:
        session.add_shared(share, granted)
    option = SubOptions(False, retain_as_published, identifier)
    if option != SubOptions():
        session.set_options(share, option)
    message = Message("a/b", b"x", qos, retain, "other")
    copy = copy_for(session, shared_queue(share, "me"), message, [], Parts())
    assert not copy.skip
    assert copy.qos == min(qos, 0 if granted is None else granted)
    assert copy.retain is (retain and retain_as_published)
    assert copy.sub_ids == ((identifier,) if identifier else ())
