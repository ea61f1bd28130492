"""What an address that has not logged in may hold, and what failing to log in costs it.

`UnauthenticatedSockets` counts the sockets that have no CONNACK yet, overall and per source
address: past `max_unauthenticated` or `max_unauthenticated_per_address` a new socket is closed
at once, before a byte of it is read, so a flood of sockets cannot hold the node's memory or
file descriptors. `FailedLogins` makes failed logins from an address wait before their refusal,
longer with each failure (`login_failure_delay` doubling up to `login_failure_delay_max`), so a
password guesser's sockets each stay busy for a while and its rate of guesses falls; a success
never waits. Such an address is `failing` until its failures are forgotten: its password checks
take a lane of their own (`bridge.access.login_queue`). Both are pure: the caller gives the
address and the clock.
"""

from __future__ import annotations

from typing import Final

from bridge.access.ratelimit import LogThrottle

MAX_TRACKED_SOURCES: Final = 100_000
"""Addresses `FailedLogins` remembers at most (the longest-quiet ones are forgotten first)."""
FORGET_AFTER_DELAYS: Final = 10
"""An address's failures are forgotten after this many `login_failure_delay_max` of quiet (at
least this many seconds)."""
LOG_INTERVAL: Final = 10.0
"""Seconds between log lines about connections closed before their CONNACK."""


class UnauthenticatedSockets:
    """Sockets without a CONNACK yet, overall and per source address, and their limits."""

    __slots__ = ("by_source", "log_throttle", "max_per_source", "max_total", "total")

    def __init__(self, max_total: int, max_per_source: int) -> None:
        self.max_total = max_total
        """Sockets without a CONNACK at most (0: unlimited)."""
        self.max_per_source = max_per_source
        """Such sockets from one address at most (0: unlimited)."""
        self.total = 0
        self.by_source: dict[str, int] = {}
        self.log_throttle = LogThrottle(LOG_INTERVAL)
        """One log line per `LOG_INTERVAL` about connections closed before their CONNACK."""

    def arrive(self, source: str) -> str | None:
        """A socket from `source` was accepted: None if it is counted and may be read, else why
        it must be closed at once (and it is not counted)."""
        if self.max_total and self.total >= self.max_total:
            return f"{self.total} sockets have not logged in (max_unauthenticated={self.max_total})"
        held = self.by_source.get(source, 0)
        if self.max_per_source and held >= self.max_per_source:
            return (
                f"{held} sockets from {source} have not logged in "
                f"(max_unauthenticated_per_address={self.max_per_source})"
            )
        self.by_source[source] = held + 1
        self.total += 1
        return None

    def leave(self, source: str) -> None:
        """A counted socket logged in or closed."""
        held = self.by_source.get(source, 0)
        if held <= 1:
            self.by_source.pop(source, None)
        else:
            self.by_source[source] = held - 1
        if held:
            self.total -= 1


class FailedLogins:
    """Recent failed logins per source address, and how long the next refusal waits."""

    __slots__ = ("first_delay", "max_delay", "memory", "recent")

    def __init__(self, first_delay: float, max_delay: float) -> None:
        self.first_delay = first_delay
        """The wait of an address's first failure (0: failures never wait)."""
        self.max_delay = max(max_delay, first_delay)
        self.memory = max(self.max_delay, 1.0) * FORGET_AFTER_DELAYS
        """Seconds of quiet after which an address's failures are forgotten."""
        self.recent: dict[str, tuple[int, float]] = {}
        """Address -> (failures in a row, when the last one was), least recent first."""

    def failed(self, source: str, now: float) -> float:
        """A login from `source` failed at `now`: seconds to wait before refusing it (the
        failure is remembered even when failures do not wait)."""
        recent = self.recent
        count, last = recent.pop(source, (0, now))
        if now - last > self.memory:
            count = 0
        count += 1
        recent[source] = (count, now)
        if len(recent) > MAX_TRACKED_SOURCES:
            del recent[next(iter(recent))]
        if self.first_delay <= 0:
            return 0.0
        delay: float = self.first_delay * 2.0 ** min(count - 1, 30)
        return min(delay, self.max_delay)

    def failures(self, source: str) -> int:
        """Failures in a row remembered for `source`."""
        return self.recent.get(source, (0, 0.0))[0]

    def failing(self, source: str, now: float) -> bool:
        """Whether logins from `source` failed lately (its failures are not forgotten yet at
        `now`): its password checks then come after those of other addresses
        (`bridge.access.login_queue`)."""
        entry = self.recent.get(source)
        return entry is not None and now - entry[1] <= self.memory
