"""The broker groups of the RocketMQ store, and the parts of a bridge queue they hold.

A broker group is one master and its slaves under one brokerName. A message is stored on one
group, and its light queues (LMQs) are filled on that group only: the LMQ of a bridge queue
exists on every group that stored a message for it, with offsets of its own on each. So a
bridge queue is read as one *part* per group, each with its own position: the part's name
(`part_name`) is what the node keeps a cursor for, and what ends, wakes and backlogs count.

`BrokerGroups` knows the groups (from the NameServer's cluster table, refreshed by the store):
those registered now and those that were and are gone (kept, so their parts can be read to
their end while a slave still serves them), and which group each RocketMQ topic's messages go to
(`pick`): a rendezvous hash of the topic over the groups that take writes, so every node picks
the same group, a new group takes only its share of topics, and one publisher's messages of one
topic stay on one group (and so in order) until that group stops taking writes.

A message's `seq` must be unique in the whole store; commit-log offsets are unique per group
only, so `group_seq` joins the offset with a 16-bit tag of the group's name.

`GroupLearning` fills `BrokerGroups` from RocketMQ: the cluster table when the store opens and
every `group_refresh` seconds after, and which groups take writes from the default topic's
route.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Protocol

from bridge.storage.base import StoreUnavailable
from bridge.storage.rocketmq.connection import RocketMQError
from bridge.storage.rocketmq.types import DEFAULT_TOPIC, PERM_WRITE, BrokerInfo, TopicRoute
from bridge.storage.rocketmq.wire import RemotingProtocolError

__all__ = [
    "PART_PREFIX",
    "BrokerGroups",
    "GroupLearning",
    "group_seq",
    "group_tag",
    "part_name",
    "require_part",
    "split_part",
]

log = logging.getLogger("bridge.storage.rocketmq")

PART_PREFIX = "@"
"""First character of a part name; no bridge queue name starts with it (router/queues.py)."""
_TAG_BITS = 16
_TAG_MASK = (1 << _TAG_BITS) - 1
FAILED_GROUP_SECONDS = 3.0
"""How long a group whose master could not be reached gets no new topics (unless no other
group takes writes)."""


def part_name(group: str, queue: str) -> str:
    """The part of bridge queue `queue` held by broker group `group`."""
    return f"{PART_PREFIX}{group}\x00{queue}"


def split_part(part: str) -> tuple[str, str] | None:
    """(group, bridge queue) of a part name; None for a name that is not one."""
    if not part.startswith(PART_PREFIX):
        return None
    group, sep, queue = part[1:].partition("\x00")
    if not sep or not group:
        return None
    return group, queue


def require_part(part: str) -> tuple[str, str]:
    """(group, bridge queue) of a part name; StoreUnavailable for a name that is not one."""
    split = split_part(part)
    if split is None:
        raise StoreUnavailable(f"{part!r} is not a part of a bridge queue (see parts())")
    return split


def group_tag(group: str) -> int:
    """The 16-bit tag of a group's name in the seqs of its messages."""
    return zlib.crc32(group.encode()) & _TAG_MASK


def group_seq(commit_log_offset: int, tag: int) -> int:
    """A store-wide unique seq: the message's commit-log offset on its group, and the group."""
    return (commit_log_offset << _TAG_BITS) | tag


def _weight(group: str, topic: str) -> int:
    return zlib.crc32(f"{group}\x00{topic}".encode())


class BrokerGroups:
    """The broker groups this store knows, where each is read, and where each topic goes."""

    __slots__ = ("_failed", "_groups", "_parts", "_pins", "generation", "read_only", "tags")

    def __init__(self) -> None:
        self._groups: dict[str, BrokerInfo] = {}
        """Every group seen since start, by name (one gone from the NameServer has no
        addresses)."""
        self._pins: dict[str, str] = {}
        self._failed: dict[str, float] = {}
        self.tags: dict[str, int] = {}
        self.read_only: frozenset[str] = frozenset()
        """Groups whose brokers take no writes (an operator removed the write permission to
        drain them). A broker still stores what is sent to a normal topic then; clients are to
        keep away, so every pick does."""
        self.generation = 0
        """Grows whenever a group is seen for the first time (parts of queues change)."""
        self._parts: dict[str, tuple[int, tuple[str, ...]]] = {}
        """Bridge queue -> (generation, its parts), as last computed."""

    def update(self, brokers: dict[str, BrokerInfo]) -> list[str]:
        """Learn the NameServer's cluster table; returns the groups seen for the first time.

        A group that left the table is kept with no addresses: its parts stay known (readers
        finish what they can), and it takes no writes.
        """
        new = [name for name in sorted(brokers) if name not in self._groups]
        for name in list(self._groups):
            if name not in brokers:
                self._groups[name] = BrokerInfo(name, self._groups[name].cluster, {})
        for name, info in brokers.items():
            self._groups[name] = info
            self.tags.setdefault(name, group_tag(name))
        if new:
            self.generation += 1
        return new

    def names(self) -> list[str]:
        """Every known group, sorted."""
        return sorted(self._groups)

    def parts(self, queue: str) -> tuple[str, ...]:
        """The parts of a bridge queue: one per group known."""
        generation = self.generation
        cached = self._parts.get(queue)
        if cached is not None and cached[0] == generation:
            return cached[1]
        parts = tuple(part_name(group, queue) for group in self.names())
        self._parts[queue] = (generation, parts)
        return parts

    def upgrade_part(self, queue: str) -> str:
        """The part a position kept under a bridge queue's own name (by a version that read one
        broker group only: the first by name) now belongs to."""
        if split_part(queue) is not None:
            return queue
        names = self.names()
        return part_name(names[0], queue) if names else queue

    def registered(self, name: str) -> bool:
        """Whether a broker of the group is registered with the NameServer now."""
        info = self._groups.get(name)
        return info is not None and bool(info.addrs)

    def tag(self, name: str) -> int:
        """The seq tag of a group (also of one not in the cluster table yet)."""
        tag = self.tags.get(name)
        if tag is None:
            tag = self.tags[name] = group_tag(name)
        return tag

    def tag_collisions(self) -> list[tuple[str, str]]:
        """Pairs of known groups whose names share a seq tag (their seqs could collide)."""
        seen: dict[int, str] = {}
        out: list[tuple[str, str]] = []
        for name in sorted(self.tags):
            other = seen.setdefault(self.tags[name], name)
            if other != name:
                out.append((other, name))
        return out

    # --- writes ----------------------------------------------------------------------------------

    def pick(self, topic: str, writable: Iterable[str]) -> str | None:
        """The group `topic`'s next message goes to, among the `writable` ones: the one it went
        to before while that one still takes writes, else the rendezvous choice (groups whose
        master failed a moment ago only if no other takes writes). None if none is writable."""
        candidates = sorted(set(writable) - self.read_only)
        if not candidates:
            return None
        pinned = self._pins.get(topic)
        if pinned in candidates and not self._recently_failed(pinned):
            return pinned
        healthy = [g for g in candidates if not self._recently_failed(g)] or candidates
        chosen = max(healthy, key=lambda group: _weight(group, topic))
        self._pins[topic] = chosen
        return chosen

    def failed(self, group: str) -> None:
        """A send to the group's master failed: give its topics to other groups for a while."""
        self._failed[group] = time.monotonic() + FAILED_GROUP_SECONDS
        for topic in [t for t, g in self._pins.items() if g == group]:
            del self._pins[topic]

    def _recently_failed(self, group: str | None) -> bool:
        until = self._failed.get(group or "")
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._failed[group or ""]
            return False
        return True


class ClusterTable(Protocol):
    """Where the store's reader client learns the broker groups (`RocketMQClient`)."""

    async def fetch_cluster_brokers(self) -> dict[str, BrokerInfo]:
        """The NameServer's cluster table now: broker groups by name."""
        ...


class TopicRoutes(Protocol):
    """Where the store's sending client learns topic routes (`RocketMQClient`)."""

    async def fetch_route(self, topic: str) -> TopicRoute:
        """The route of `topic` now (its queues on each group, with their permissions)."""
        ...


class GroupLearning:
    """Fills `BrokerGroups` from RocketMQ: the groups in the NameServer's cluster table, and
    which of them take writes (module docstring)."""

    def __init__(
        self,
        groups: BrokerGroups,
        table: ClusterTable,
        routes: TopicRoutes,
        forget_targets: Callable[[frozenset[str]], None],
    ) -> None:
        self.groups = groups
        self.table = table
        """The reader client: it asks for the cluster table."""
        self.routes = routes
        """The sending client: it asks for the default topic's route."""
        self.forget_targets = forget_targets
        """Called with the groups that stopped taking writes (the send pipeline routes anew)."""

    def learn(self, brokers: dict[str, BrokerInfo]) -> list[str]:
        """Learn a cluster table; returns the groups seen for the first time."""
        new = self.groups.update(brokers)
        for first, second in self.groups.tag_collisions():
            log.error(
                "broker groups %r and %r share a seq tag: QoS 2 deliveries of their messages "
                "may be confused; rename one",
                first,
                second,
            )
        return new

    async def learn_write_permissions(self) -> None:
        """Which groups take writes, from the default topic's route (every broker with
        autoCreateTopicEnable serves it, with its broker permission): topics of a group that
        was drained move now, not when their own cached routes go stale; a new group is in it
        at once for topics first used from now on."""
        try:
            route = await self.routes.fetch_route(DEFAULT_TOPIC)
        except (RocketMQError, RemotingProtocolError):
            return  # no such template (autoCreateTopicEnable off): topic routes tell, later
        read_only = frozenset(q.broker_name for q in route.queues if not q.perm & PERM_WRITE)
        if read_only != self.groups.read_only:
            if read_only - self.groups.read_only:
                log.info("broker group(s) %s take no writes: sending elsewhere", sorted(read_only))
            self.groups.read_only = read_only
            self.forget_targets(read_only)

    async def refresh(self) -> list[str] | None:
        """Learn the groups added to (or gone from) the NameServer and which take writes; the
        groups seen for the first time, or None if the cluster table could not be read."""
        try:
            brokers = await self.table.fetch_cluster_brokers()
        except (RocketMQError, RemotingProtocolError) as exc:
            log.debug("broker group refresh failed: %s", exc)
            return None
        new = self.learn(brokers)
        await self.learn_write_permissions()
        return new
