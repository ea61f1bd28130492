"""How a message goes out to one subscriber under its MQTT 5.0 subscription options.

Pure functions of a session and a message: which Subscription Identifiers the copy carries, its
RETAIN flag (Retain As Published), and whether No Local keeps it from its own publisher. A 3.1.1
session has no options, and every answer is the 3.1.1 one (no identifiers, RETAIN 0 on live
messages, nothing held back).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from bridge.mqtt import codec
from bridge.mqtt.properties import encode_property_block_content
from bridge.mqtt.topics import parse_shared, topic_matches
from bridge.session import Session, SubOptions
from bridge.storage.base import Message
from bridge.storage.metadata import to_publish

_NONE = SubOptions()


def shared_v5_publish(message: Message) -> bytes:
    """The QoS 0 v5 PUBLISH of `message` every v5 receiver without options or aliases takes
    as it is (encoded once per fan-out, as the 3.1.1 one is)."""
    props = b""
    if message.properties:
        now_ms = int(time.time() * 1000)
        props = encode_property_block_content(
            to_publish(message.properties, message.timestamp_ms, now_ms)
        )
    return codec.encode_publish5(message.topic, message.payload, 0, False, False, None, props)


def _matches(topic_filter: str, topic: str) -> bool:
    parsed = parse_shared(topic_filter) if topic_filter[:1] == "$" else None
    return topic_matches(parsed[1] if parsed is not None else topic_filter, topic)


def live_copy(
    session: Session, topic: str, publisher: str, retain: bool
) -> tuple[bool, bool, tuple[int, ...]]:
    """For a message sent now to a client the router matched on `topic`: whether it goes at
    all (No Local), its RETAIN flag and its Subscription Identifiers."""
    options = session.options
    if not options:
        return True, False, ()
    own = publisher == session.client_id
    ids: list[int] = []
    keep_retain = False
    allowed = False
    matched_with_options: set[str] = set()
    for topic_filter, option in options.items():
        if not _matches(topic_filter, topic):
            continue
        matched_with_options.add(topic_filter)
        if own and option.no_local:
            continue
        allowed = True
        if option.identifier:
            ids.append(option.identifier)
        keep_retain = keep_retain or option.retain_as_published
    if not matched_with_options:
        return True, False, ()  # matched through filters without options
    if not allowed:
        # No Local held back every filter with options: one without options lets it go.
        allowed = any(
            _matches(f, topic)
            for f in (*session.subscriptions, *session.shared)
            if f not in matched_with_options
        )
    return allowed, retain and keep_retain, tuple(sorted(set(ids)))


def stored_copy(
    session: Session, filters: Iterable[str], publisher: str, retain: bool
) -> tuple[str | None, bool, tuple[int, ...]]:
    """For a stored message dispatched to these filters of the client: the filter it is sent
    from (the one granting the highest QoS among those No Local does not exclude, ties broken
    by the filter string; None if none may send it), its RETAIN flag, its Subscription
    Identifiers (those of every matching filter)."""
    granted = session.subscriptions
    options = session.options
    own = publisher == session.client_id
    best_qos = -1
    best = None
    ids: list[int] = []
    keep_retain = False
    for topic_filter in filters:
        qos = granted.get(topic_filter)
        if qos is None:
            continue
        option = options.get(topic_filter, _NONE) if options else _NONE
        if own and option.no_local:
            continue
        if option.identifier:
            ids.append(option.identifier)
        keep_retain = keep_retain or option.retain_as_published
        if (qos, topic_filter) > (best_qos, best or ""):
            best_qos, best = qos, topic_filter
    return best, retain and keep_retain, tuple(sorted(set(ids)))
