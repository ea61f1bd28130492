"""Counters of what the node did and dropped; read by logs, tests and (later) the admin API."""

from __future__ import annotations

from collections import Counter


class Metrics:
    """Monotonic counters by name. Cheap enough for the hot path (one dict update)."""

    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()

    def inc(self, name: str, amount: int = 1) -> None:
        """Add `amount` to counter `name`."""
        self.counters[name] += amount

    def get(self, name: str) -> int:
        """The current value of counter `name` (0 if never counted)."""
        return self.counters[name]

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        return dict(self.counters)
