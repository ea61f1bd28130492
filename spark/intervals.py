"""Device state and alarm intervals from telemetry samples, and their split into shifts.

Pure code, no Spark: the streaming job runs `DeviceTrack.advance` inside a stateful operator
(one track per device, kept in Spark's state store), the batch job runs it once over all of a
device's messages. The same function makes both tables, so a stream that has seen everything
and a back-fill over the same messages produce the same rows (a property test checks this).

A state interval runs from the first message reporting a state to the first message reporting
a different one; an alarm interval from the first message listing a code to the first one not
listing it. Only closed intervals are emitted: the one still running is in the track.

Messages are applied in device-clock order (`ts`, then `seq`). A stream only applies those at or
before the watermark and keeps the rest pending, so messages arriving out of order (a device's
messages are spread over several RocketMQ queues) are still applied in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

MS_PER_DAY = 86_400_000


@dataclass(frozen=True, slots=True)
class Sample:
    """One valid telemetry message, as the interval builder needs it."""

    ts: int
    seq: int
    state: str
    alarms: frozenset[str]
    line: str
    station: str


@dataclass(frozen=True, slots=True)
class Interval:
    """A closed interval: `kind` "state" (what = the state) or "alarm" (what = the code)."""

    kind: str
    device: str
    line: str
    station: str
    what: str
    start: int
    end: int


@dataclass(slots=True)
class DeviceTrack:
    """What the builder knows about one device between calls."""

    device: str
    line: str = ""
    station: str = ""
    state: str | None = None
    state_start: int = 0
    alarms: dict[str, int] = field(default_factory=dict)
    """Open alarm code -> start."""
    last_ts: int = -1
    last_seq: int = -1
    pending: list[Sample] = field(default_factory=list)

    def advance(self, samples: Iterable[Sample], watermark: int) -> tuple[list[Interval], int]:
        """Take `samples`, apply every pending one with ts <= `watermark` in order; returns the
        intervals that closed and how many samples were too late to apply (older than one
        already applied; they are left out)."""
        late = 0
        waiting = {s.seq for s in self.pending}
        for sample in samples:
            if sample.seq in waiting:
                continue  # the same message twice (a QoS 1 retransmission)
            if sample.ts < self.last_ts or (
                sample.ts == self.last_ts and sample.seq <= self.last_seq
            ):
                late += 1
            else:
                self.pending.append(sample)
                waiting.add(sample.seq)
        self.pending.sort(key=lambda s: (s.ts, s.seq))
        closed: list[Interval] = []
        ready = 0
        for sample in self.pending:
            if sample.ts > watermark:
                break
            self._apply(sample, closed)
            ready += 1
        del self.pending[:ready]
        return closed, late

    def _apply(self, sample: Sample, closed: list[Interval]) -> None:
        ts = sample.ts
        if self.state is None:
            self.state, self.state_start = sample.state, ts
        elif sample.state != self.state:
            closed.append(self._interval("state", self.state, self.state_start, ts))
            self.state, self.state_start = sample.state, ts
        for code in sorted(set(self.alarms) - sample.alarms):
            closed.append(self._interval("alarm", code, self.alarms.pop(code), ts))
        for code in sorted(sample.alarms - set(self.alarms)):
            self.alarms[code] = ts
        self.line, self.station = sample.line, sample.station
        self.last_ts, self.last_seq = ts, sample.seq

    def _interval(self, kind: str, what: str, start: int, end: int) -> Interval:
        return Interval(kind, self.device, self.line, self.station, what, start, end)

    @property
    def next_due(self) -> int | None:
        """Device time of the earliest pending sample (the watermark must pass it)."""
        return self.pending[0].ts if self.pending else None

    # -- state store form

    def to_json(self) -> str:
        return json.dumps(
            {
                "line": self.line,
                "station": self.station,
                "state": self.state,
                "state_start": self.state_start,
                "alarms": self.alarms,
                "last_ts": self.last_ts,
                "last_seq": self.last_seq,
                "pending": [
                    [s.ts, s.seq, s.state, sorted(s.alarms), s.line, s.station]
                    for s in self.pending
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, device: str, text: str) -> DeviceTrack:
        data = json.loads(text)
        return cls(
            device=device,
            line=data["line"],
            station=data["station"],
            state=data["state"],
            state_start=data["state_start"],
            alarms=dict(data["alarms"]),
            last_ts=data["last_ts"],
            last_seq=data["last_seq"],
            pending=[
                Sample(ts, seq, state, frozenset(alarms), line, station)
                for ts, seq, state, alarms, line, station in data["pending"]
            ],
        )


# --- shifts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shifts:
    """A day cut into shifts at fixed UTC times, e.g. 06:00, 14:00, 22:00 (the default).

    A shift is named by the date it starts on and its number (1 = the first start time of the
    day), so the night shift 22:00-06:00 belongs to the day it began."""

    starts_minutes: tuple[int, ...] = (6 * 60, 14 * 60, 22 * 60)

    @classmethod
    def parse(cls, text: str) -> Shifts:
        """From "06:00,14:00,22:00" (raises ValueError)."""
        minutes = []
        for part in text.split(","):
            hours, sep, mins = part.strip().partition(":")
            if not sep or not hours.isdigit() or not mins.isdigit():
                raise ValueError(f"shift start {part.strip()!r}: expected HH:MM")
            value = int(hours) * 60 + int(mins)
            if not 0 <= value < 24 * 60:
                raise ValueError(f"shift start {part.strip()!r} is not a time of day")
            minutes.append(value)
        if not minutes or len(set(minutes)) != len(minutes):
            raise ValueError("shift starts must be distinct and at least one")
        return cls(tuple(sorted(minutes)))

    def boundaries(self, start_ms: int, end_ms: int) -> list[tuple[int, str, int]]:
        """(shift start ms, shift date ISO, shift number) of every shift overlapping
        [start_ms, end_ms), in order."""
        day = datetime.fromtimestamp(start_ms / 1000, tz=UTC).date() - timedelta(days=1)
        out: list[tuple[int, str, int]] = []
        while True:
            midnight = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
            for number, minute in enumerate(self.starts_minutes, start=1):
                begin = midnight + minute * 60_000
                if begin >= end_ms:
                    return out
                out.append((begin, day.isoformat(), number))
            day += timedelta(days=1)

    def pieces(self, start_ms: int, end_ms: int) -> list[tuple[str, int, int, int]]:
        """[start_ms, end_ms) cut at shift boundaries: (shift date, shift number, shift start
        ms, milliseconds inside that shift), for each shift it overlaps."""
        bounds = self.boundaries(start_ms, end_ms)
        out = []
        for i, (begin, date, number) in enumerate(bounds):
            end = bounds[i + 1][0] if i + 1 < len(bounds) else begin + MS_PER_DAY
            lo, hi = max(begin, start_ms), min(end, end_ms)
            if lo < hi:
                out.append((date, number, begin, hi - lo))
        return out


def days_touched(intervals: Iterable[tuple[str, int, int]], shifts: Shifts) -> set[str]:
    """The days whose daily tables new closed intervals change, from (kind, start ms, end ms):
    every shift date a state interval overlaps (availability is per shift, and an interval
    can run across midnight into the next day's shifts), and the start date of an alarm (the
    alarm summary counts an alarm on the day it began)."""
    days: set[str] = set()
    for kind, start, end in intervals:
        if kind == "state":
            days.update(date for date, _, _, _ in shifts.pieces(start, end))
        else:
            days.add(datetime.fromtimestamp(start / 1000, tz=UTC).date().isoformat())
    return days


def batch_intervals(device: str, samples: Sequence[Sample]) -> list[Interval]:
    """Every closed interval of a device's samples at once (a back-fill)."""
    track = DeviceTrack(device)
    closed, _ = track.advance(samples, watermark=2**62)
    return closed
