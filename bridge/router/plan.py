"""Where a message goes: the routing decision, as a pure function that returns a plan.

Given a message's topic and QoS, the subscription trie (this node's clients under their
ClientIds, peers under their peer ids), the shared-subscription groups, and which clients are
connected here or reachable anywhere, `plan_route` says:

* ``direct``: the local clients that get a QoS 0 copy now (no queue): every connected
  subscriber of a QoS 0 message, and shared members picked at QoS 0;
* ``peers``: the peer nodes a QoS 0 message is forwarded to, for their own subscribers;
* ``handed``: shared members held by a peer that were picked for a QoS 0 copy;
* ``queues``: the queues a QoS 1/2 message is stored on (one per matching filter, one for the
  picked member of each matching shared group);
* ``readers``: whom to wake once it is durable (local ClientIds, peer subscriber ids);
* ``unserved``: shared groups of a QoS 0 message no member could take (the message is dropped
  for them, and counted).

The node carries the plan out; nothing here does I/O. Picking a shared member advances that
group's round-robin, so a plan is made once per message.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any, Final, TypeVar

from bridge.router.queues import (
    CLIENT,
    FILTER,
    PEER_PREFIX,
    SHARED,
    filter_queue,
    parse_queue,
    shared_queue,
)
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie

__all__ = [
    "ConnectionTable",
    "DirectRoutes",
    "RoutePlan",
    "plan_route",
    "possible_queues",
    "readers_of",
]

_T = TypeVar("_T")


class RoutePlan:
    """What to do with one message (see the module docstring)."""

    __slots__ = ("direct", "handed", "peers", "queues", "readers", "unserved")

    def __init__(self) -> None:
        # Written out rather than a dataclass: one plan per message, on the publish hot path.
        self.direct: list[str] = []
        self.peers: list[str] = []
        self.handed: list[str] = []
        self.queues: list[str] = []
        self.readers: list[str] = []
        self.unserved = 0

    def __repr__(self) -> str:
        return (
            f"RoutePlan(direct={self.direct}, peers={self.peers}, handed={self.handed}, "
            f"queues={self.queues}, readers={self.readers}, unserved={self.unserved})"
        )


def plan_route(
    topic: str,
    qos: int,
    trie: SubscriptionTrie,
    shared: SharedSubscriptions,
    connected: Container[str],
    reachable: Callable[[str], bool],
    reader_of: Callable[[str], str],
) -> RoutePlan:
    """The plan for a message on `topic` at `qos`.

    `connected`: ClientIds with a connection on this node. `reachable`: whether a shared member
    can take a message now (connected here or on a peer). `reader_of`: the reader to wake for a
    shared member's queue (the ClientId if its session is here, else the peer holding it).

    QoS 0: each matching subscriber once (MQTT-3.3.5-1), connected ones directly, peers by
    forwarding; each matching shared group's next reachable member. QoS 1/2: a queue per
    matching filter, woken for every subscriber of it; each shared group's next reachable
    member (any member if none is reachable, so the message waits in its queue), or a direct
    copy where that member was granted QoS 0.
    """
    plan = RoutePlan()
    if qos == 0:
        direct = plan.direct
        peers = plan.peers
        for subscriber in trie.matched_subscribers(topic):
            if subscriber in connected:
                direct.append(subscriber)
            elif subscriber[0] == PEER_PREFIX:
                peers.append(subscriber[1:])
        if shared:
            for _share_filter, group in shared.match(topic):
                member = group.pick(reachable)
                if member is None:
                    plan.unserved += 1
                elif member in connected:
                    direct.append(member)
                else:
                    plan.handed.append(member)
        return plan
    queues = plan.queues
    readers = plan.readers
    for topic_filter, subscribers in trie.match(topic):
        queues.append(filter_queue(topic_filter))
        readers.extend(subscribers)
    if shared:
        for share_filter, group in shared.match(topic):
            member = group.pick(reachable) or group.pick()
            if member is None:
                continue
            if min(group.members.get(member, 0), qos) == 0:
                if member in connected:
                    plan.direct.append(member)
                else:
                    plan.handed.append(member)
                continue
            queues.append(shared_queue(share_filter, member))
            readers.append(reader_of(member))
    return plan


def possible_queues(topic: str, trie: SubscriptionTrie, shared: SharedSubscriptions) -> list[str]:
    """Every queue `plan_route` could store a QoS 1/2 message on `topic` on now: one per matching
    filter, and each member's queue of every matching shared group (the round-robin picks one,
    which is not known afterwards). For re-reading the ends of where a message landed unseen."""
    queues = [filter_queue(topic_filter) for topic_filter, _ in trie.match(topic)]
    if shared:
        for share_filter, group in shared.match(topic):
            queues.extend(shared_queue(share_filter, member) for member in group.members)
    return queues


def readers_of(queue: str, trie: SubscriptionTrie, reader_of: Callable[[str], str]) -> list[str]:
    """Who reads `queue` from this node: the subscribers of a filter queue (clients and peers),
    the owner of a private queue, the reader of a shared member's queue."""
    parsed = parse_queue(queue)
    if parsed is None:
        return []
    if parsed.kind == FILTER:
        return list(trie.subscribers(parsed.topic_filter))
    if parsed.kind == CLIENT:
        return [parsed.client_id]
    assert parsed.kind == SHARED
    return [reader_of(parsed.client_id)]


class ConnectionTable(dict[str, _T]):
    """ClientId -> connection, counting its changes (`version`), so a remembered plan can tell
    whether the set of connected clients is still the one it was made for. Reads are plain dict
    reads; every way of changing the table moves `version`."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def __setitem__(self, key: str, value: _T) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, _T]:
        self.version += 1
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.version += 1
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.version += 1
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self.version += 1
        super().clear()

    # dict's own `|=` would change the table without moving `version`; typeshed types `|=` in a
    # way no subclass can restate, hence the ignore.
    def __ior__(self, other: Any) -> ConnectionTable[_T]:  # type: ignore[override,misc]
        self.version += 1
        super().update(other)
        return self


class DirectRoutes:
    """Remembered plans, per topic, for a node without shared subscriptions.

    A QoS 0 plan depends only on the trie's match for the topic and on which clients are
    connected, so it is kept while the trie hands out the same match (it replaces a match on
    every change) and the connection table's `version` is the same. A QoS 1/2 plan (queues
    and readers) depends on the match alone. The plans handed out are shared: read them, never
    change them. Bounded: each table is emptied when `size` topics are remembered.
    """

    __slots__ = ("_plans", "_queued", "_size")

    def __init__(self, size: int = 4096) -> None:
        self._plans: dict[str, tuple[object, int, RoutePlan]] = {}
        self._queued: dict[str, tuple[object, RoutePlan]] = {}
        self._size = size

    def queued_plan(self, topic: str, trie: SubscriptionTrie) -> RoutePlan:
        """`plan_route(topic, 1 or 2, ...)` with no shared groups, remembered: one plan per
        topic rather than one per message, since planning the route of each QoS 1 message, at
        the pace of its commit, would be a twelfth of its cost."""
        match = trie.matched_subscribers(topic)
        known = self._queued.get(topic)
        if known is not None and known[0] is match:
            return known[1]
        plan = plan_route(topic, 1, trie, _NO_GROUPS, _NO_ONE, _nobody, str)
        queued = self._queued
        if len(queued) >= self._size:
            queued.clear()
        queued[topic] = (match, plan)
        return plan

    def plan(
        self, topic: str, trie: SubscriptionTrie, connected: ConnectionTable[Any]
    ) -> RoutePlan:
        """`plan_route(topic, 0, ...)` with no shared groups, remembered."""
        match = trie.matched_subscribers(topic)
        known = self._plans.get(topic)
        if known is not None and known[0] is match and known[1] == connected.version:
            return known[2]
        plan = plan_route(topic, 0, trie, _NO_GROUPS, connected, _nobody, str)
        plans = self._plans
        if len(plans) >= self._size:
            plans.clear()
        plans[topic] = (match, connected.version, plan)
        return plan


def _nobody(_client_id: str) -> bool:
    return False


_NO_GROUPS: Final = SharedSubscriptions(cache_size=0)
"""The (always empty) shared groups `DirectRoutes` plans with."""

_NO_ONE: Final[frozenset[str]] = frozenset()
"""Who is connected, for a QoS 1/2 plan without shared groups: it does not ask."""
