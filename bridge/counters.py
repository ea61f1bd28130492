"""Counters of what the node did and dropped; read by logs, tests, `$SYS` topics, the admin API
and the Prometheus exposition (`bridge.operations.prometheus`).

A leaf room: the node, the listeners and the stores' users count here without importing the
operations room, which sits above the node and reads these counters.

Plain ints and lists, updated on the hot path without locks (everything runs on the event loop);
the exposition turns them into Prometheus families when it is scraped.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

PACKET_TYPES = (
    "reserved",
    "connect",
    "connack",
    "publish",
    "puback",
    "pubrec",
    "pubrel",
    "pubcomp",
    "subscribe",
    "suback",
    "unsubscribe",
    "unsuback",
    "pingreq",
    "pingresp",
    "disconnect",
    "auth",
)
"""MQTT control packet type names by type number (the high nibble of the first byte)."""

STORE_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    """A cumulative-on-read histogram of durations in seconds (Prometheus buckets)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = STORE_LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (in the first bucket whose bound is not below it, as
        `bisect_left` would find it: a compiled loop over a dozen bounds is cheaper than the
        call, and this runs for every stored message)."""
        i = 0
        for bound in self.bounds:
            if seconds <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        """How many durations were observed."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as text, observations <= it) for each bucket, ending with +Inf."""
        total = 0
        result = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            result.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return result

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile `q` (None before any observation)."""
        total = self.count
        if not total:
            return None
        rank = q * total
        seen = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")


HOT_COUNTERS: Final = (
    "messages_in_qos0", "messages_in_qos1", "messages_in_qos2", "messages_out_qos0",
    "messages_out_qos1", "messages_out_qos2", "bytes_out",
)  # fmt: skip
"""The counters moved for every message or write: native ints, not items of a `Counter` (an
item of a `Counter` cost about a microsecond per update in compiled code). Read them with
`get` or `snapshot`."""


class Metrics:
    """Monotonic counters by name, packets by type and the store latency. Cheap enough for the
    hot path (a native int, one dict or one list update)."""

    __slots__ = (
        "_named", "bytes_in", "bytes_out", "messages_in_qos0", "messages_in_qos1",
        "messages_in_qos2", "messages_out_qos0", "messages_out_qos1", "messages_out_qos2",
        "packets_in", "packets_out", "store_latency",
    )  # fmt: skip

    def __init__(self) -> None:
        self.messages_in_qos0 = 0
        self.messages_in_qos1 = 0
        self.messages_in_qos2 = 0
        self.messages_out_qos0 = 0
        self.messages_out_qos1 = 0
        self.messages_out_qos2 = 0
        self.bytes_out = 0
        """`HOT_COUNTERS`: PUBLISHes accepted and sent by QoS, and bytes written to clients."""
        self._named: Counter[str] = Counter()
        """Every other counter, by name: counted only by `inc`, read by `get` and `snapshot`,
        so there is one way to count."""
        self.packets_in = [0] * 16
        """PUBLISH, PUBACK, ... received, indexed by packet type number."""
        self.packets_out = [0] * 16
        """Packets sent, indexed by packet type number."""
        self.bytes_in = 0
        self.store_latency = LatencyHistogram()
        """Seconds from a client's QoS 1/2 PUBLISH being handed to the store to it being
        durable (the time before its PUBACK/PUBREC)."""

    def inc(self, name: str, amount: int = 1) -> None:
        """Add `amount` to counter `name` (the hot path adds to `HOT_COUNTERS` directly)."""
        if name in HOT_COUNTERS:
            setattr(self, name, getattr(self, name) + amount)
        else:
            self._named[name] += amount

    def get(self, name: str) -> int:
        """The current value of counter `name` (0 if never counted)."""
        if name in HOT_COUNTERS:
            value: int = getattr(self, name)
            return value
        return self._named[name]

    def received(self, qos: int) -> None:
        """One PUBLISH of `qos` accepted from a client."""
        if qos == 1:
            self.messages_in_qos1 += 1
        elif qos == 0:
            self.messages_in_qos0 += 1
        else:
            self.messages_in_qos2 += 1

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        copy = dict(self._named)
        for name in HOT_COUNTERS:
            copy[name] = getattr(self, name)
        return copy
