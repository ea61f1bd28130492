"""A bounded cache whose entries expire: the one behind cached password verifications
(`bridge.access.hashes.VerifiedCache`) and ACL decisions (`bridge.access.acl.Acl`). Pure; not
thread-safe by itself (the password cache holds a lock around it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most `size` entries, each for `ttl` seconds (0: nothing is kept). When full, expired
    entries go first, then the oldest."""

    __slots__ = ("_clock", "_entries", "size", "ttl")

    def __init__(self, ttl: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K) -> V | None:
        """The value stored under `key`, or None if absent or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() < entry[1]:
            return entry[0]
        del self._entries[key]
        return None

    def put(self, key: K, value: V) -> None:
        """Keep `value` under `key` for `ttl` seconds."""
        if self.ttl <= 0:
            return
        now = self._clock()
        entries = self._entries
        if len(entries) >= self.size:
            for expired in [k for k, (_, expires) in entries.items() if expires <= now]:
                del entries[expired]
            while len(entries) >= self.size:
                del entries[next(iter(entries))]  # oldest first (insertion order)
        entries[key] = (value, now + self.ttl)

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
