"""Shared subscriptions: ``$share/{group}/{filter}`` (MQTT 5.0 section 4.8.2).

Every (group, filter) pair is one :class:`SharedGroup`; a matching message goes to one member of
each matching group, chosen round-robin by :meth:`SharedGroup.pick`. :class:`SharedSubscriptions`
keys the groups by their full share filter (``"$share/g/f"``) and finds the groups matching a
topic with a :class:`~bridge.router.trie.SubscriptionTrie` of inner filter -> share keys, so
shared filters follow exactly the same matching rules as ordinary ones (including the ``$``
rule: ``$share/g/#`` does not match ``$SYS/x``).

Parsing ``$share/...`` is the caller's job; it passes the share key, group and inner filter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

from bridge.router.trie import SubscriptionTrie

__all__ = ["SharedGroup", "SharedSubscriptions"]


class SharedGroup:
    """The members ``{subscriber: qos}`` of one shared subscription, picked round-robin.

    Members rotate in join order. The cursor is the index of the next member to try; it is
    adjusted when a member before it leaves, so nobody is skipped or served twice in a round, and
    a member joining mid-round gets its turn at the end of the current round.
    """

    __slots__ = ("_cursor", "_members", "_order", "group", "members", "topic_filter")

    def __init__(self, group: str = "", topic_filter: str = "") -> None:
        self.group = group
        self.topic_filter = topic_filter
        self._members: dict[str, int] = {}
        self._order: list[str] = []
        self._cursor = 0
        self.members: Mapping[str, int] = MappingProxyType(self._members)
        """A live read-only view of ``{subscriber: qos}``."""

    def add(self, subscriber: str, qos: int) -> bool:
        """Add ``subscriber`` (True) or update the QoS of an existing member (False)."""
        is_new = subscriber not in self._members
        self._members[subscriber] = qos
        if is_new:
            self._order.append(subscriber)
        return is_new

    def remove(self, subscriber: str) -> bool:
        """Remove ``subscriber``; returns True if it was a member."""
        if self._members.pop(subscriber, None) is None:
            return False
        index = self._order.index(subscriber)
        del self._order[index]
        if index < self._cursor:
            self._cursor -= 1
        return True

    def pick(self, eligible: Callable[[str], bool] | None = None) -> str | None:
        """The next member in rotation for which ``eligible`` holds, or None if there is none.

        Ineligible members are skipped without losing their place: the cursor moves just past
        the member picked. Without ``eligible`` every member is eligible.
        """
        order = self._order
        n = len(order)
        if n == 0:
            return None
        start = self._cursor
        for k in range(n):
            i = (start + k) % n
            member = order[i]
            if eligible is None or eligible(member):
                self._cursor = i + 1
                return member
        return None

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, subscriber: object) -> bool:
        return subscriber in self._members

    def __iter__(self) -> Iterator[str]:
        """The members in rotation order (a snapshot)."""
        return iter(list(self._order))

    def __repr__(self) -> str:
        return (
            f"<SharedGroup group={self.group!r} filter={self.topic_filter!r} "
            f"members={len(self._order)}>"
        )


class SharedSubscriptions:
    """All shared-subscription groups, keyed by share filter, matched through a trie."""

    __slots__ = ("_groups", "_trie")

    def __init__(self, cache_size: int | None = None) -> None:
        self._groups: dict[str, SharedGroup] = {}
        # Inner filter -> {share key: 0}; the QoS slot is unused.
        self._trie = SubscriptionTrie() if cache_size is None else SubscriptionTrie(cache_size)

    def subscribe(
        self, share_filter: str, group: str, topic_filter: str, subscriber: str, qos: int
    ) -> bool:
        """Add ``subscriber`` to the group ``share_filter`` (``$share/{group}/{topic_filter}``).

        Returns True if the membership is new, False if only its QoS was updated.
        """
        shared = self._groups.get(share_filter)
        if shared is None:
            shared = self._groups[share_filter] = SharedGroup(group, topic_filter)
            self._trie.subscribe(topic_filter, share_filter, 0)
        elif shared.topic_filter != topic_filter or shared.group != group:
            raise ValueError(
                f"{share_filter!r} is registered for group {shared.group!r} and filter "
                f"{shared.topic_filter!r}, not {group!r} and {topic_filter!r}"
            )
        return shared.add(subscriber, qos)

    def unsubscribe(self, share_filter: str, subscriber: str) -> bool:
        """Remove ``subscriber`` from ``share_filter``'s group; True if it was a member.

        A group left empty is dropped.
        """
        shared = self._groups.get(share_filter)
        if shared is None or not shared.remove(subscriber):
            return False
        if not shared:
            del self._groups[share_filter]
            self._trie.unsubscribe(shared.topic_filter, share_filter)
        return True

    def match(self, topic: str) -> list[tuple[str, SharedGroup]]:
        """``(share key, group)`` for every group whose inner filter matches ``topic``."""
        groups = self._groups
        return [(key, groups[key]) for _filter, keys in self._trie.match(topic) for key in keys]

    def group(self, share_filter: str) -> SharedGroup | None:
        """The group of ``share_filter``, or None."""
        return self._groups.get(share_filter)

    def groups(self) -> Iterator[tuple[str, SharedGroup]]:
        """Every ``(share key, group)`` (a snapshot)."""
        return iter(list(self._groups.items()))

    def __contains__(self, share_filter: object) -> bool:
        return share_filter in self._groups

    def __len__(self) -> int:
        """The number of groups."""
        return len(self._groups)

    def __repr__(self) -> str:
        return f"<SharedSubscriptions groups={len(self._groups)}>"
