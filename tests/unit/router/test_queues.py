"""Queue names and peer subscriber ids: built and parsed in one place (`bridge.router.queues`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.router.queues import (
    CLIENT,
    FILTER,
    SHARED,
    QueueName,
    client_queue,
    filter_of,
    filter_queue,
    is_peer,
    parse_queue,
    peer_of,
    peer_subscriber,
    queue_kind,
    share_filter_of,
    shared_queue,
)

# Topic filters and ClientIds never contain NUL (MQTT-1.5.3-2).
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))
nonempty = text.filter(bool)


@given(text)
def test_filter_queue_names_parse_back(topic_filter):
    queue = filter_queue(topic_filter)
    assert parse_queue(queue) == QueueName(FILTER, topic_filter, "")
    assert queue_kind(queue) == FILTER and filter_of(queue) == topic_filter


@given(text)
def test_client_queue_names_parse_back(client_id):
    queue = client_queue(client_id)
    assert parse_queue(queue) == QueueName(CLIENT, "", client_id)
    assert queue_kind(queue) == CLIENT


@given(nonempty, text)
def test_shared_queue_names_parse_back(share_filter, client_id):
    queue = shared_queue(share_filter, client_id)
    assert parse_queue(queue) == QueueName(SHARED, share_filter, client_id)
    assert queue_kind(queue) == SHARED and share_filter_of(queue) == share_filter


@given(text, text)
def test_the_three_kinds_never_collide(a, b):
    assert len({filter_queue(a), client_queue(a), shared_queue(a or "x", b)}) == 3


def test_names_no_bridge_builds_do_not_parse():
    assert parse_queue("") is None
    assert parse_queue("x:y") is None
    assert parse_queue("f") is None
    assert parse_queue("s:no-member-separator") is None


@given(nonempty, text)
def test_peer_subscriber_ids_are_never_client_ids(node_id, client_id):
    subscriber = peer_subscriber(node_id)
    assert is_peer(subscriber) and peer_of(subscriber) == node_id
    assert not is_peer(client_id)
