"""Queue names and subscriber ids: built here, and parsed only here.

A QoS 1/2 message is stored on *queues*; each connected reader keeps a cursor per queue it reads.
There are three kinds of subscribers' queues, and the store treats every name as opaque text:

* ``f:<filter>`` - every message matching a (non-shared) topic filter, read by each subscriber
  of that filter on any node;
* ``c:<ClientId>`` - one client's private queue (retained messages sent on SUBSCRIBE);
* ``s:<share filter>NUL<ClientId>`` - the messages picked for one member of a shared
  subscription;

and one of the node's own on the embedded store, ``d:`` (`DELAYED_QUEUE`): delayed publishes
waiting for their due time, read out of order by `bridge.node.delayed`, never by a subscriber.

Subscribers in a node's trie are ClientIds, or a peer node standing for its own subscribers:
``NUL<node id>`` (no ClientId contains NUL, MQTT-1.5.3-2).
"""

from __future__ import annotations

from typing import Final, NamedTuple

FILTER: Final = "f"
CLIENT: Final = "c"
SHARED = "s"
"""The kind of a queue: the first character of its name."""

PEER_PREFIX: Final = "\x00"
"""Subscriber ids in a node's trie that stand for a peer node (no ClientId contains NUL)."""

ANY_PEER = "*"
"""The peer a session was handed to when a node does not know which (it learned that another
node owns the ClientId from a refused registry write): the session's filters count as this
pseudo-peer's interest for `interest_grace`, and its wakes go to every peer. No node id is "*"
(`bridge.cluster.settings_checks` refuses it)."""

DELAYED_QUEUE: Final = "d:"
"""The queue delayed publishes wait on until due (embedded store: `bridge.node.delayed`)."""

_FILTER_PREFIX = FILTER + ":"
_CLIENT_PREFIX = CLIENT + ":"
_SHARED_PREFIX = SHARED + ":"


def filter_queue(topic_filter: str) -> str:
    """The queue that holds every QoS>0 message matching a (non-shared) topic filter."""
    return _FILTER_PREFIX + topic_filter


def client_queue(client_id: str) -> str:
    """A client's private queue: retained messages delivered on SUBSCRIBE."""
    return _CLIENT_PREFIX + client_id


def shared_queue(share_filter: str, client_id: str) -> str:
    """The queue of one member of a shared subscription: messages picked for it."""
    return f"{_SHARED_PREFIX}{share_filter}\x00{client_id}"


class QueueName(NamedTuple):
    """A parsed queue name: its kind, and the filter (``f``: topic filter, ``s``: share filter,
    ``c``: empty) and ClientId (``c`` and ``s``; ``f``: empty) it names."""

    kind: str
    topic_filter: str
    client_id: str


def parse_queue(queue: str) -> QueueName | None:
    """The parts of a queue name; None for a name no bridge builds."""
    kind, sep, rest = queue[:1], queue[1:2], queue[2:]
    if sep != ":":
        return None
    if kind == FILTER:
        return QueueName(FILTER, rest, "")
    if kind == CLIENT:
        return QueueName(CLIENT, "", rest)
    if kind == SHARED:
        share_filter, nul, client_id = rest.rpartition("\x00")
        return QueueName(SHARED, share_filter, client_id) if nul else None
    return None


def queue_kind(queue: str) -> str:
    """The kind (``f``, ``c`` or ``s``) of a queue name (the delivery hot path's cheap test)."""
    return queue[0]


def filter_of(queue: str) -> str:
    """The topic filter of an ``f`` queue (the filter part of an ``s`` queue with its member)."""
    return queue[2:]


def share_filter_of(queue: str) -> str:
    """The share filter (``$share/group/filter``) of an ``s`` queue."""
    return queue[2:].rpartition("\x00")[0]


def peer_subscriber(node_id: str) -> str:
    """The trie subscriber id that stands for a peer node."""
    return PEER_PREFIX + node_id


def is_peer(subscriber: str) -> bool:
    """Whether a trie subscriber id stands for a peer node rather than a client."""
    return subscriber[:1] == PEER_PREFIX


def peer_of(subscriber: str) -> str:
    """The node id a peer subscriber id stands for."""
    return subscriber[1:]
