"""Which streamed messages count and which come too late, per device.

The stream's telemetry query decides each new row against what it kept of the row's device
(`Seen`) and the event-time watermark in force. It hands Spark's `applyInPandasWithState` (without
a timeout, so Spark passes on every row, those behind the watermark too) a bucket of devices at a
time (`sort_bucket`, `DEVICE_BUCKETS`), not a device: a call per device costs a pandas frame per
device and micro-batch, which at a few thousand devices was most of the query's time, while a
row's fate depends only on its own device's `Seen`:

* a row behind the watermark is *late*: the tables built on event time have closed that time (a
  minute written, an interval applied), so it goes to the `late` table, with the watermark it
  missed, instead of being dropped without a trace as Spark's own operators do;
* a row whose (device, seq) counted already, while that one is still within the watermark, is a
  duplicate (a QoS 1 message resent and stored twice) and goes nowhere, as Spark's
  dropDuplicatesWithinWatermark would;
* every other row counts: it goes to the `telemetry` table.

A copy of a counted message that arrives only once the watermark has passed the first is late
like any other; `late` rows whose (device, seq) is also in `telemetry` are such copies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

DEVICE_BUCKETS = 64
"""Devices are sorted in this many groups (`pmod(xxhash64(device), DEVICE_BUCKETS)`), each
group's `Seen`s kept as one state row. It is part of the query's state layout: a checkpoint
written with another value holds its devices under other buckets, so it must not change."""


@dataclass(slots=True)
class Seen:
    """The seqs a device counted whose event time the watermark has not passed: seq -> ts_ms.
    Kept in the query's state between micro-batches, in its bucket's `BucketSeen`."""

    seqs: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sorted:
    """Positions (in the rows given) of the rows that count and of the late ones."""

    counted: list[int]
    late: list[int]


@dataclass(slots=True)
class BucketSeen:
    """`Seen` of every device of one bucket that counted a seq the watermark has not passed:
    device -> Seen. Kept in the query's state between micro-batches, as JSON."""

    devices: dict[str, Seen] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {device: seen.seqs for device, seen in self.devices.items()}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> BucketSeen:
        return cls(
            {
                device: Seen({int(seq): int(ts) for seq, ts in seqs.items()})
                for device, seqs in json.loads(text).items()
            }
        )


def sort_bucket(
    rows: Sequence[tuple[str, int, int]], seen: BucketSeen, watermark_ms: int
) -> Sorted:
    """Sort the new rows of a bucket's devices, (device, seq, ts_ms) in arrival order, against
    the watermark and what each device counted before: each row is decided by its own device's
    `Seen` alone. `seen` is updated and pruned of seqs the watermark has passed, and of devices
    left with none."""
    counted: list[int] = []
    late: list[int] = []
    devices = seen.devices
    for position, (device, seq, ts_ms) in enumerate(rows):
        if ts_ms < watermark_ms:
            late.append(position)
            continue
        kept = devices.get(device)
        if kept is None:
            kept = devices[device] = Seen()
        if seq not in kept.seqs:
            kept.seqs[seq] = ts_ms
            counted.append(position)
    for device in list(devices):
        seqs = devices[device].seqs
        for seq in [s for s, ts in seqs.items() if ts < watermark_ms]:
            del seqs[seq]
        if not seqs:
            del devices[device]
    return Sorted(counted, late)
