"""The subscription table: topic filters -> {subscriber: QoS}, matched level by level.

Filters are stored in a trie with one node per topic level (the topic split on ``/``). Every node
keeps its literal children in a dict and its ``+`` and ``#`` children in two dedicated slots, so a
publish walks the literal path with one dict lookup per level and only branches where a ``+``
exists (the sublist layout used by NATS). A node that ends a filter holding at least one
subscriber carries an *entry*: the pair ``(filter, {subscriber: qos})``. That dict is created once
per filter and never replaced, so it is live: results handed out (and cached) see QoS updates and
subscribers joining or leaving a filter that already has subscribers.

Topics and filters are validated by the caller (the protocol layer); nothing here checks them.

Matching rules (MQTT 3.1.1 section 4.7 / MQTT 5.0 section 4.7):

* ``#`` matches the parent level and any number of child levels: ``a/#`` matches ``a``,
  ``a/b`` and ``a/b/c`` (MQTT-4.7.1-2).
* ``+`` matches exactly one level, including an empty one: ``a/+/b`` matches ``a//b``
  (MQTT-4.7.1-3).
* A filter starting with a wildcard never matches a topic whose first level starts with ``$``;
  ``$SYS/#`` still matches ``$SYS/x`` (MQTT-4.7.2-1).
* A subscriber matched by several overlapping filters gets one copy at the highest of their
  QoS values (MQTT-3.3.5-1), see :meth:`SubscriptionTrie.match_subscribers`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["DEFAULT_CACHE_SIZE", "Entry", "SubscriptionTrie"]

DEFAULT_CACHE_SIZE = 4096

Entry = tuple[str, dict[str, int]]
"""A matching filter and its live ``{subscriber: qos}`` dict (read-only for callers)."""


class _Node:
    """One topic level of the trie."""

    __slots__ = ("children", "entry", "hash", "plus")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.entry: Entry | None = None

    def is_empty(self) -> bool:
        return self.entry is None and not self.children and self.plus is None and self.hash is None


def _collect(node: _Node, levels: list[str], i: int, n: int, out: list[Entry]) -> None:
    """Append the entries under ``node`` matching ``levels[i:]`` to ``out``.

    Follows the literal path iteratively and recurses only into ``+`` children, so a table
    without wildcards costs one dict lookup per level.
    """
    while True:
        h = node.hash
        if h is not None and h.entry is not None:
            # '#' covers levels[i:], including none at all (the parent level, MQTT-4.7.1-2).
            out.append(h.entry)
        if i == n:
            if node.entry is not None:
                out.append(node.entry)
            return
        p = node.plus
        if p is not None:
            _collect(p, levels, i + 1, n, out)
        child = node.children.get(levels[i])
        if child is None:
            return
        node = child
        i += 1


class SubscriptionTrie:
    """Topic filters -> subscribers, with bounded caches of match results per topic.

    Two caches of at most ``cache_size`` topics each, emptied whenever full
    (``cache_size=0`` disables both):

    * the :meth:`match` cache holds the matching ``(filter, live dict)`` entries. It is emptied
      when the set of filters changes (a filter gaining its first or losing its last subscriber);
      changes *within* a filter's subscriber dict need no invalidation since the dict is live.
    * the :meth:`match_subscribers` cache holds merged ``{subscriber: qos}`` snapshots, so it is
      emptied by every successful subscribe or unsubscribe, QoS updates included.
    """

    __slots__ = ("_cache", "_cache_size", "_count", "_filters", "_root", "_subs_cache", "added")

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self._root = _Node()
        self._filters: dict[str, _Node] = {}
        self._count = 0
        self.added = 0
        """Subscriptions ever added (a subscriber new to a filter; never goes down): whoever
        kept readers it matched earlier can tell that they may be out of date."""
        self._cache_size = cache_size
        self._cache: dict[str, list[Entry]] = {}
        # topic -> merged {subscriber: qos}; not live, so emptied on *every* change.
        self._subs_cache: dict[str, dict[str, int]] = {}

    # -- mutation ---------------------------------------------------------------------------

    def subscribe(self, topic_filter: str, subscriber: str, qos: int) -> bool:
        """Add ``subscriber`` to ``topic_filter`` with ``qos``.

        Returns True if the subscription is new, False if it existed and only its QoS was set.
        """
        self._subs_cache.clear()
        node = self._filters.get(topic_filter)
        if node is not None:
            assert node.entry is not None
            subs = node.entry[1]
            is_new = subscriber not in subs
            subs[subscriber] = qos
            if is_new:
                self._count += 1
                self.added += 1
            return is_new

        node = self._root
        for level in topic_filter.split("/"):
            if level == "+":
                nxt = node.plus
                if nxt is None:
                    nxt = node.plus = _Node()
            elif level == "#":
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = _Node()
            else:
                nxt = node.children.get(level)
                if nxt is None:
                    nxt = node.children[level] = _Node()
            node = nxt
        node.entry = (topic_filter, {subscriber: qos})
        self._filters[topic_filter] = node
        self._count += 1
        self.added += 1
        self._cache.clear()
        return True

    def unsubscribe(self, topic_filter: str, subscriber: str) -> bool:
        """Remove ``subscriber`` from ``topic_filter``; returns True if it was subscribed.

        A filter left without subscribers is removed and its now-empty nodes are pruned.
        """
        node = self._filters.get(topic_filter)
        if node is None:
            return False
        assert node.entry is not None
        subs = node.entry[1]
        if subs.pop(subscriber, None) is None:
            return False
        self._count -= 1
        self._subs_cache.clear()
        if not subs:
            node.entry = None
            del self._filters[topic_filter]
            self._prune(topic_filter)
            self._cache.clear()
        return True

    def _prune(self, topic_filter: str) -> None:
        """Remove the empty nodes along ``topic_filter``'s path, deepest first."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            path.append((node, level))
            if level == "+":
                nxt = node.plus
            elif level == "#":
                nxt = node.hash
            else:
                nxt = node.children.get(level)
            if nxt is None:  # pragma: no cover - the path exists while the filter is known
                return
            node = nxt
        for parent, level in reversed(path):
            if not node.is_empty():
                return
            if level == "+":
                parent.plus = None
            elif level == "#":
                parent.hash = None
            else:
                del parent.children[level]
            node = parent

    def clear(self) -> None:
        """Remove every subscription."""
        self._root = _Node()
        self._filters.clear()
        self._count = 0
        self._cache.clear()
        self._subs_cache.clear()

    # -- matching (the publish hot path) ----------------------------------------------------

    def _entries(self, topic: str) -> list[Entry]:
        """The matching entries of ``topic``, shared with the cache: never mutate it."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        out: list[Entry] = []
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        first = levels[0]
        if first[:1] == "$":
            # MQTT-4.7.2-1: no wildcard at the first level may match a '$' topic.
            child = root.children.get(first)
            if child is not None:
                _collect(child, levels, 1, n, out)
        else:
            _collect(root, levels, 0, n, out)
        size = self._cache_size
        if size:
            cache = self._cache
            if len(cache) >= size:
                cache.clear()
            cache[topic] = out
        return out

    def match(self, topic: str) -> list[Entry]:
        """Every filter with subscribers that matches ``topic``, as ``(filter, subscribers)``.

        The ``{subscriber: qos}`` dicts are the live ones stored in the table: read them, never
        mutate them. The order is unspecified.
        """
        return list(self._entries(topic))

    def match_subscribers(self, topic: str) -> dict[str, int]:
        """Each subscriber matched by ``topic`` once, with its highest QoS (MQTT-3.3.5-1).

        Returns a new dict the caller owns.
        """
        return dict(self.matched_subscribers(topic))

    def matched_subscribers(self, topic: str) -> Mapping[str, int]:
        """What `match_subscribers` returns, without the copy: the cached mapping itself, for
        the publish hot path. Read it at once and never mutate it; a later subscribe or
        unsubscribe replaces it rather than changing it."""
        cached = self._subs_cache.get(topic)
        if cached is not None:
            return cached
        entries = self._entries(topic)
        if not entries:
            result: dict[str, int] = {}
        else:
            result = entries[0][1].copy()
            for i in range(1, len(entries)):
                get = result.get
                for subscriber, qos in entries[i][1].items():
                    if get(subscriber, -1) < qos:
                        result[subscriber] = qos
        size = self._cache_size
        if size:
            cache = self._subs_cache
            if len(cache) >= size:
                cache.clear()
            cache[topic] = result
        return result

    # -- inspection -------------------------------------------------------------------------

    def subscribers(self, topic_filter: str) -> dict[str, int]:
        """A copy of ``topic_filter``'s ``{subscriber: qos}`` (empty if it has none)."""
        node = self._filters.get(topic_filter)
        if node is None or node.entry is None:
            return {}
        return dict(node.entry[1])

    def filters(self) -> Iterator[str]:
        """The filters holding at least one subscriber (a snapshot, safe to mutate during)."""
        return iter(list(self._filters))

    def __contains__(self, topic_filter: object) -> bool:
        """Whether ``topic_filter`` has at least one subscriber."""
        return topic_filter in self._filters

    def __len__(self) -> int:
        """The number of (filter, subscriber) pairs."""
        return self._count

    def __repr__(self) -> str:
        return f"<SubscriptionTrie filters={len(self._filters)} subscriptions={self._count}>"
