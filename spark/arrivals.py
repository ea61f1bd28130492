"""Which streamed messages count and which come too late, per device.

The stream's telemetry query hands each device's new rows to `sort_arrivals`, with what it kept
of the device (`Seen`) and the event-time watermark in force (`spark.jobs` does it through
`applyInPandasWithState` without a timeout, so Spark passes on every row, those behind the
watermark too):

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


@dataclass(slots=True)
class Seen:
    """The seqs a device counted whose event time the watermark has not passed: seq -> ts_ms.
    Kept in the query's state between micro-batches, as JSON."""

    seqs: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.seqs, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Seen:
        return cls({int(seq): int(ts) for seq, ts in json.loads(text).items()})


@dataclass(frozen=True, slots=True)
class Sorted:
    """Positions (in the rows given) of the rows that count and of the late ones."""

    counted: list[int]
    late: list[int]


def sort_arrivals(rows: Sequence[tuple[int, int]], seen: Seen, watermark_ms: int) -> Sorted:
    """Sort one device's new rows, (seq, ts_ms) in arrival order, against the watermark and
    what it counted before; `seen` is updated and pruned of seqs the watermark has passed."""
    counted: list[int] = []
    late: list[int] = []
    for position, (seq, ts_ms) in enumerate(rows):
        if ts_ms < watermark_ms:
            late.append(position)
        elif seq not in seen.seqs:
            seen.seqs[seq] = ts_ms
            counted.append(position)
    for seq in [s for s, ts in seen.seqs.items() if ts < watermark_ms]:
        del seen.seqs[seq]
    return Sorted(counted, late)
