"""PURE. Rate limits: the token bucket, a client's publish pacer, the limits an operator may change
at run time and their rules, and a log throttle. No I/O, no clock: every call that depends on
time is handed `now` (seconds of a monotonic clock).

A limit never loses anything. A client over its publish rate has its socket read later
(`PublishPacer` says for how long), a CONNECT over the node's connection rate waits for its turn
(`TokenBucket.reserve`), and only one that would wait longer than a bound is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


class LimitError(ValueError):
    """A limit set to a value that cannot work; the message names the limit and says why."""


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up. Taking more than there are is allowed
    and leaves the bucket in debt, so one large message is never stuck behind a small burst:
    the debt is what the caller waits for."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0 or not burst > 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> float:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.tokens

    def take(self, amount: float, now: float) -> float:
        """Take `amount` tokens; the seconds until the bucket is out of debt (0: it is not)."""
        tokens = self._refill(now) - amount
        self.tokens = tokens
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def wait(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0: it is not); takes nothing."""
        tokens = self._refill(now)
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def reserve(self, amount: float, now: float, max_wait: float) -> float | None:
        """Take `amount` tokens if they are there within `max_wait` seconds: the seconds to wait
        before using them (0: at once), or None (nothing taken) if they would come later."""
        tokens = self._refill(now) - amount
        if tokens >= 0:
            self.tokens = tokens
            return 0.0
        wait = -tokens / self.rate
        if wait > max_wait:
            return None
        self.tokens = tokens
        return wait


def bucket_for(rate: float, now: float) -> TokenBucket | None:
    """The bucket of a per-second limit (None for 0, no limit): it saves up one second's worth,
    and at least one token."""
    if not rate:
        return None
    return TokenBucket(rate, max(float(rate), 1.0), now)


class PublishPacer:
    """One client's publish limits: PUBLISH packets a second and bytes a second (what it sends,
    headers included). `charge` is told what one read brought; a positive answer is how long
    the connection should stop reading."""

    __slots__ = ("_bytes", "_messages")

    def __init__(self, messages_per_second: float, bytes_per_second: float, now: float) -> None:
        self._messages = bucket_for(messages_per_second, now)
        self._bytes = bucket_for(bytes_per_second, now)

    @classmethod
    def of(
        cls, messages_per_second: float, bytes_per_second: float, now: float
    ) -> PublishPacer | None:
        """A pacer for these limits, or None when both are 0 (off)."""
        if not messages_per_second and not bytes_per_second:
            return None
        return cls(messages_per_second, bytes_per_second, now)

    def charge(self, publishes: int, size: int, now: float) -> float:
        """Count a read of `size` bytes holding `publishes` PUBLISH packets: the seconds to stop
        reading for (0: read on)."""
        wait = 0.0
        if self._messages is not None and publishes:
            wait = self._messages.take(publishes, now)
        if self._bytes is not None:
            wait = max(wait, self._bytes.take(size, now))
        return wait

    def wait(self, now: float) -> float:
        """Seconds until the client is within its limits again (0: it is)."""
        wait = 0.0
        if self._messages is not None:
            wait = self._messages.wait(now)
        if self._bytes is not None:
            wait = max(wait, self._bytes.wait(now))
        return wait


# -- the limits changeable at run time -------------------------------------------------------

MAX_RATE = 1e9
MAX_CONNECTIONS = 100_000_000
MAX_WAIT = 3600.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits in force on a node; each 0 means unlimited (except `connection_rate_wait`).
    The configuration gives the defaults; the admin API overrides them (`PUT /api/v1/limits`)."""

    max_connections: int = 0
    """Client sockets this node holds; a CONNECT beyond gets CONNACK 0x97 (3.1.1: 3)."""
    connection_rate: float = 0.0
    """New connections a second this node takes; more wait for their turn."""
    connection_rate_wait: float = 5.0
    """Seconds a CONNECT may wait for its turn; later ones get CONNACK 0x9F (3.1.1: 3)."""
    client_publish_rate: float = 0.0
    """PUBLISH packets a second one client may send; faster ones are read later."""
    client_publish_bytes_rate: int = 0
    """Bytes a second one client may send; faster ones are read later."""

    def as_dict(self) -> dict[str, int | float]:
        """The limits by name (JSON-ready)."""
        return asdict(self)

    def overridden(self, overrides: Mapping[str, int | float]) -> Limits:
        """These limits with `overrides` (checked by `check_limit`) in place of the defaults."""
        return replace(self, **overrides)  # type: ignore[arg-type]  # names checked

    @property
    def paces_publishes(self) -> bool:
        """Whether a client's publishes are limited at all."""
        return bool(self.client_publish_rate or self.client_publish_bytes_rate)


LIMIT_NAMES: tuple[str, ...] = tuple(Limits.__dataclass_fields__)
_INTEGERS = frozenset({"max_connections", "client_publish_bytes_rate"})
_MAXIMA: dict[str, float] = {
    "max_connections": MAX_CONNECTIONS,
    "connection_rate": MAX_RATE,
    "connection_rate_wait": MAX_WAIT,
    "client_publish_rate": MAX_RATE,
    "client_publish_bytes_rate": MAX_RATE,
}


def check_limit(name: str, value: Any) -> int | float:
    """`value` as limit `name` takes it, or LimitError naming the limit and the fault."""
    if name not in _MAXIMA:
        raise LimitError(f"{name}: not a limit (known: {', '.join(LIMIT_NAMES)})")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LimitError(f"{name}: expected a number, got {value!r}")
    if name in _INTEGERS and not (isinstance(value, int) or float(value).is_integer()):
        raise LimitError(f"{name}: expected a whole number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        zero = "no waiting" if name == "connection_rate_wait" else "unlimited"
        raise LimitError(f"{name}: must be a finite number, 0 or more (0: {zero}), got {value}")
    maximum = _MAXIMA[name]
    if value > maximum:
        raise LimitError(f"{name}: at most {maximum:g}, got {value:g}")
    return int(value) if name in _INTEGERS else float(value)


def parse_changes(data: Any) -> dict[str, int | float | None]:
    """A request to change limits: a JSON object of limit name -> number, or null to go back to
    the configured default. LimitError names the first fault."""
    if not isinstance(data, dict):
        raise LimitError("body must be a JSON object of limit name -> number (or null)")
    if not data:
        raise LimitError(f"no limit named (known: {', '.join(LIMIT_NAMES)})")
    changes: dict[str, int | float | None] = {}
    for name, value in data.items():
        changes[name] = None if value is None and name in _MAXIMA else check_limit(name, value)
    return changes


def parse_overrides(data: Mapping[str, Any]) -> tuple[dict[str, int | float], list[str]]:
    """Stored overrides (as read back from Redis or a file): the valid ones and a message for
    each that is not (skipped, so a bad record never takes a node's limits away)."""
    valid: dict[str, int | float] = {}
    faults: list[str] = []
    for name, value in data.items():
        try:
            valid[name] = check_limit(name, value)
        except LimitError as exc:
            faults.append(str(exc))
    return valid, faults


class LogThrottle:
    """At most one log line per `interval` seconds about a recurring event: `note` says whether
    to log this one and how many were suppressed since the last line."""

    __slots__ = ("interval", "last", "suppressed")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = -math.inf
        self.suppressed = 0

    def note(self, now: float) -> tuple[bool, int]:
        """One event at `now`: (log it?, events not logged since the last line that was)."""
        if now - self.last >= self.interval:
            suppressed, self.suppressed, self.last = self.suppressed, 0, now
            return True, suppressed
        self.suppressed += 1
        return False, 0
