"""Quotas on what a client can make the server keep: pure counters, no I/O.

A `Tally` counts the things of one kind the node keeps (retained messages, delayed publishes),
in total and per owner (the publisher's ClientId), by count and by bytes. Its question,
`fault_adding`, says whether keeping one more (or replacing one under the same key) would pass
a `Quota`; the caller refuses the message then, with the reason code its protocol level has
(docs/decisions.md, "Quotas").

The tally follows what is kept, not what was asked for: it changes when the store confirmed a
write. Two publishes checked before either is confirmed may together pass a limit by what the
client has in flight (bounded by `max_inbound_pending`); the limits are about memory and disk,
where that margin does not matter, and checking at confirmation would have to refuse a message
the store already holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Quota:
    """The limits of one kind of kept thing; 0 leaves a limit off."""

    max_count: int = 0
    max_bytes: int = 0
    max_count_per_client: int = 0
    max_bytes_per_client: int = 0
    names: tuple[str, str, str, str] = (
        "max_count",
        "max_bytes",
        "max_count_per_client",
        "max_bytes_per_client",
    )
    """The settings behind the four limits, in that order, named in a refusal."""


class Tally:
    """Count and bytes of kept things, in total and per owner; each kept under a key (a
    retained message's topic, a delayed publish's message key)."""

    __slots__ = ("_items", "_owners", "bytes")

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, int]] = {}
        self._owners: dict[str, list[int]] = {}  # owner -> [count, bytes]
        self.bytes = 0
        """Bytes of everything kept."""

    @property
    def count(self) -> int:
        """How many things are kept."""
        return len(self._items)

    def of(self, owner: str) -> tuple[int, int]:
        """(count, bytes) of what `owner` keeps."""
        usage = self._owners.get(owner)
        return (usage[0], usage[1]) if usage is not None else (0, 0)

    def add(self, key: str, owner: str, size: int) -> None:
        """`owner` now keeps `size` bytes under `key` (replacing what was kept under it)."""
        self.remove(key)
        self._items[key] = (owner, size)
        usage = self._owners.get(owner)
        if usage is None:
            usage = self._owners[owner] = [0, 0]
        usage[0] += 1
        usage[1] += size
        self.bytes += size

    def remove(self, key: str) -> None:
        """Nothing is kept under `key` any more."""
        item = self._items.pop(key, None)
        if item is None:
            return
        owner, size = item
        self.bytes -= size
        usage = self._owners[owner]
        usage[0] -= 1
        usage[1] -= size
        if usage[0] == 0:
            del self._owners[owner]

    def clear(self) -> None:
        """Nothing is kept (before a fresh count: the store's records read back)."""
        self._items.clear()
        self._owners.clear()
        self.bytes = 0

    def fault_adding(self, key: str, owner: str, size: int, quota: Quota) -> str | None:
        """Whether `owner` keeping `size` bytes under `key` (replacing what is kept under it)
        would pass `quota`: a sentence naming the limit, or None when it fits."""
        old = self._items.get(key)
        count, total = self.count, self.bytes
        own_count, own_bytes = self.of(owner)
        if old is None:
            count += 1
            own_count += 1
        else:
            total -= old[1]
            if old[0] == owner:
                own_bytes -= old[1]
            else:
                own_count += 1
        total += size
        own_bytes += size
        names = quota.names
        if quota.max_count and count > quota.max_count:
            return f"{names[0]}={quota.max_count} reached"
        if quota.max_bytes and total > quota.max_bytes:
            return f"{names[1]}={quota.max_bytes} bytes would be passed"
        if quota.max_count_per_client and own_count > quota.max_count_per_client:
            return f"{names[2]}={quota.max_count_per_client} reached by {owner!r}"
        if quota.max_bytes_per_client and own_bytes > quota.max_bytes_per_client:
            return f"{names[3]}={quota.max_bytes_per_client} bytes would be passed by {owner!r}"
        return None


def kept_size(topic: str, payload: bytes) -> int:
    """The bytes a kept message is counted at: its payload and its topic."""
    return len(payload) + len(topic.encode())


def subscription_fault(held: int, limit: int) -> str | None:
    """Whether a session holding `held` filters may take one more (a filter it does not hold
    yet): a sentence naming the limit, or None."""
    if held >= limit:
        return f"max_subscriptions_per_client={limit} filters held already"
    return None


def awaiting_rel_fault(awaiting: int, limit: int) -> str | None:
    """Whether a client with `awaiting` QoS 2 messages not yet released (PUBREL) may send one
    more: a sentence naming the limit, or None."""
    if awaiting >= limit:
        return f"max_awaiting_rel={limit} QoS 2 messages await PUBREL already"
    return None


def will_fault(payload_size: int, limit: int) -> str | None:
    """Whether a will of `payload_size` bytes may be kept: a sentence naming the limit, or None."""
    if payload_size > limit:
        return f"will payload of {payload_size} bytes exceeds max_will_bytes={limit}"
    return None
