"""How a message goes out to one subscriber: the copy it gets, or why it gets none.

Pure functions of a session and a message. For a stored message read from one of the client's
queues, `copy_for` decides what the client receives from that queue: the QoS, the RETAIN flag and
the Subscription Identifiers, or that it is skipped and why (it goes out from another of the
client's queues, the filter is no longer subscribed, No Local holds it back). For a message sent
live, `live_copy` says whether it goes at all and with which flag and identifiers. A 3.1.1
session has no options, and every answer is the 3.1.1 one (no identifiers, RETAIN 0 on live
messages, nothing held back). The delivery (`bridge.node.delivery`) carries the answer out.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Final, Protocol

from bridge.mqtt import codec
from bridge.mqtt.properties import encode_property_block_content
from bridge.mqtt.topics import parse_shared, topic_matches
from bridge.router.queues import CLIENT, FILTER, filter_of, queue_kind, share_filter_of
from bridge.session import Session, SubOptions
from bridge.storage.base import Message
from bridge.storage.metadata import SUBSCRIPTION_IDS, retained_qos, to_publish

_NONE: Final = SubOptions()

SKIP_OTHER_QUEUE: Final = "sent from the queue of another of its filters"
"""The message is on several of the client's filter queues and goes out once, from the queue of
the filter granting the highest QoS (MQTT-3.3.5-1)."""
SKIP_NOT_SUBSCRIBED: Final = "its filter is no longer subscribed"
"""The filter of this queue was unsubscribed after the message was stored on it."""
SKIP_NO_LOCAL: Final = "its own message, held back by No Local"
"""The client published it, and every filter it is on says No Local (MQTT-3.8.3-3)."""


class Parts(Protocol):
    """Which queue a part of a queue belongs to (the store's `queue_of_part`)."""

    def queue_of_part(self, part: str) -> str | None: ...


class Copy:
    """What one client receives for one stored message read from one of its queues: `skip` says
    why nothing (empty: the copy goes out with `qos`, `retain` and `sub_ids`). Read-only: the
    answers that carry no flag or identifier are made once and shared (`_PLAIN`, `_SKIPS`), so
    the common delivery allocates none."""

    __slots__ = ("qos", "retain", "skip", "sub_ids")

    def __init__(
        self, qos: int, retain: bool = False, sub_ids: tuple[int, ...] = (), skip: str = ""
    ) -> None:
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        """The Subscription Identifiers the PUBLISH carries (MQTT-3.3.4-3)."""
        self.skip = skip

    def __repr__(self) -> str:
        if self.skip:
            return f"Copy(skip={self.skip!r})"
        return f"Copy(qos={self.qos}, retain={self.retain}, sub_ids={self.sub_ids})"


_PLAIN: Final = (Copy(0), Copy(1), Copy(2))
"""The copy at each QoS without RETAIN or identifiers: most copies are one of these."""
_NOT_SUBSCRIBED: Final = Copy(0, skip=SKIP_NOT_SUBSCRIBED)
_NO_LOCAL: Final = Copy(0, skip=SKIP_NO_LOCAL)
_OTHER_QUEUE: Final = Copy(0, skip=SKIP_OTHER_QUEUE)


def _plain_or(qos: int, retain: bool, sub_ids: tuple[int, ...]) -> Copy:
    return _PLAIN[qos] if not retain and not sub_ids else Copy(qos, retain, sub_ids)


def copy_for(
    session: Session,
    logical: str,
    message: Message,
    parts: Sequence[str],
    store: Parts,
) -> Copy:
    """What `session`'s client receives for `message`, read from its queue `logical` (a filter,
    client or shared queue, `bridge.router.queues`); `parts`: the queue parts the message was
    stored on, whose queues the `store` names (asked only when the message is on several parts
    or the session has subscription options)."""
    kind = queue_kind(logical)
    if kind == FILTER:
        topic_filter = filter_of(logical)
        granted = session.subscriptions.get(topic_filter)
        if granted is None:
            return _NOT_SUBSCRIBED
        if len(parts) == 1 and not session.options:
            return _PLAIN[min(message.qos, granted)]
        filters = []
        for part in parts:
            name = store.queue_of_part(part) or part
            if queue_kind(name) == FILTER:
                filters.append(filter_of(name))
        best, retain, ids_of_filters = stored_copy(
            session, filters, message.publisher, message.retain
        )
        if best is None:
            return _NO_LOCAL
        if best != topic_filter:
            return _OTHER_QUEUE
        return _plain_or(min(message.qos, granted), retain, ids_of_filters)
    if kind == CLIENT:
        # The client's own queue: retained messages queued at SUBSCRIBE with the QoS granted
        # then, and messages a peer or an earlier version addressed to the client alone.
        properties = message.properties
        retained = retained_qos(properties) if properties else None
        qos = message.qos if retained is None else min(message.qos, retained)
        sub_ids: tuple[int, ...] = ()
        ids = properties.get(SUBSCRIPTION_IDS) if properties else None
        if ids:
            sub_ids = tuple(int(i) for i in ids.split(","))
        return _plain_or(qos, retained is not None, sub_ids)
    share_filter = share_filter_of(logical)
    qos = min(message.qos, session.shared.get(share_filter, 0))
    option = session.options.get(share_filter) if session.options else None
    if option is None:
        return _PLAIN[qos]
    ids_of_option = (option.identifier,) if option.identifier else ()
    return _plain_or(qos, message.retain and option.retain_as_published, ids_of_option)


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
