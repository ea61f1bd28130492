"""Device state and alarm intervals from telemetry samples.

Pure code, no Spark: the streaming job runs `DeviceTrack.advance` inside a stateful operator
(a track per device, kept in Spark's state store a bucket of devices per key: `BucketTracks`),
the batch job runs it once over all of a device's messages. The same function makes both
tables, so a stream that has seen everything and a back-fill over the same messages produce the
same rows (a property test checks this).

A state interval runs from the first message reporting a state to the first message reporting
a different one; an alarm interval from the first message listing a code to the first one not
listing it. Only closed intervals are emitted: the one still running is in the track. With a
shift calendar (`spark.shifts`) a state is also cut where a shift starts, once the device's next
message or the watermark has passed that start (`closed_by` "shift_end"), so a machine that stays
DOWN for a whole shift shows in that shift when it ends, not only when its state changes.

A device's disconnect (`spark.presence`: the broker's `$SYS` event) is a sample of state OFFLINE:
it closes the running state and every open alarm (`closed_by` "offline": whether the alarm went
on is unknown), and OFFLINE runs until the device's next report. A disconnect of a device without
a track (nothing reported yet) changes nothing.

Messages are applied in device-clock order (`ts`, then `seq`). A stream only applies those at or
before the watermark and keeps the rest pending, so messages arriving out of order (a device's
messages are spread over several RocketMQ queues) are still applied in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark.presence import OFFLINE
from spark.shifts import Shifts


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
    closed_by: str = "change"
    """"change" (the state or the alarm changed), "shift_end" (a state cut where a shift
    started), or "offline" (an alarm open when the device disconnected)."""


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
    shifts: Shifts | None = None
    """The calendar whose shift starts cut states; None: states are cut only by changes."""
    _cut_at: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    """(state_start, the first shift start after it): asked for on every sample, computed
    once per state start."""

    def advance(
        self, samples: Iterable[Sample], watermark: int, *, horizon: int | None = None
    ) -> tuple[list[Interval], int]:
        """Take `samples`, apply every pending one with ts <= `watermark` in order, then cut the
        running state at the shift starts before the watermark (or before `horizon`, when given:
        a back-fill applies everything and cuts up to the end of its data); returns the
        intervals that closed and how many samples were too late to apply (older than one
        already applied; they are left out)."""
        late = 0
        waiting = {s.seq for s in self.pending}
        for sample in samples:
            if sample.seq in waiting or (sample.ts, sample.seq) == (self.last_ts, self.last_seq):
                continue  # the same message twice (a QoS 1 retransmission, an event stored twice)
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
        self._cut_before(watermark if horizon is None else min(watermark, horizon), closed)
        return closed, late

    def _cut_before(self, limit: int, closed: list[Interval]) -> None:
        """Close the running state at every shift start after its start and before `limit`;
        it runs on from that shift start."""
        if self.shifts is None or self.state is None:
            return
        while (cut := self._next_cut(self.shifts)) < limit:
            closed.append(self._interval("state", self.state, self.state_start, cut, "shift_end"))
            self.state_start = cut

    def _next_cut(self, shifts: Shifts) -> int:
        if self._cut_at is None or self._cut_at[0] != self.state_start:
            self._cut_at = (self.state_start, shifts.next_start_after(self.state_start))
        return self._cut_at[1]

    @property
    def next_cut(self) -> int | None:
        """The shift start at which the running state is cut next (the watermark must pass it)."""
        if self.shifts is None or self.state is None:
            return None
        return self._next_cut(self.shifts)

    def _apply(self, sample: Sample, closed: list[Interval]) -> None:
        ts = sample.ts
        offline = sample.state == OFFLINE
        if offline and self.state is None:
            return  # a device never heard of, or a client that is no device
        self._cut_before(ts, closed)
        if self.state is None:
            self.state, self.state_start = sample.state, ts
        elif sample.state != self.state:
            closed.append(self._interval("state", self.state, self.state_start, ts))
            self.state, self.state_start = sample.state, ts
        why = "offline" if offline else "change"
        for code in sorted(set(self.alarms) - sample.alarms):
            closed.append(self._interval("alarm", code, self.alarms.pop(code), ts, why))
        for code in sorted(sample.alarms - set(self.alarms)):
            self.alarms[code] = ts
        if not offline:  # a disconnect names no line or station
            self.line, self.station = sample.line, sample.station
        self.last_ts, self.last_seq = ts, sample.seq

    def _interval(
        self, kind: str, what: str, start: int, end: int, closed_by: str = "change"
    ) -> Interval:
        return Interval(kind, self.device, self.line, self.station, what, start, end, closed_by)

    @property
    def next_due(self) -> int | None:
        """Device time of the earliest pending sample (the watermark must pass it)."""
        return self.pending[0].ts if self.pending else None

    @property
    def due(self) -> int | None:
        """The watermark at which the track has something to do without a new message: apply
        its earliest pending sample or cut its running state at the next shift start."""
        return min((t for t in (self.next_due, self.next_cut) if t is not None), default=None)

    # -- state store form

    def to_state(self) -> dict[str, object]:
        """The track as plain JSON values (the device and the calendar are not part of it)."""
        return {
            "line": self.line,
            "station": self.station,
            "state": self.state,
            "state_start": self.state_start,
            "alarms": self.alarms,
            "last_ts": self.last_ts,
            "last_seq": self.last_seq,
            "pending": [
                [s.ts, s.seq, s.state, sorted(s.alarms), s.line, s.station] for s in self.pending
            ],
        }

    @classmethod
    def from_state(
        cls, device: str, data: dict[str, Any], shifts: Shifts | None = None
    ) -> DeviceTrack:
        return cls(
            device=device,
            shifts=shifts,
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


@dataclass(slots=True)
class BucketTracks:
    """The tracks of one bucket of devices, kept by the stream as one state row: Spark's
    stateful operator costs a pandas frame per key and micro-batch, so a key per device was
    most of the query's time at a few thousand devices. Advancing every track of the bucket
    at each call is what a timeout per device would do: a track with nothing due is unchanged
    by `advance([], watermark)`."""

    shifts: Shifts | None
    tracks: dict[str, DeviceTrack] = field(default_factory=dict)

    def advance(
        self, samples: dict[str, list[Sample]], watermark: int
    ) -> tuple[list[Interval], dict[str, int]]:
        """Give each device its new `samples` (device -> samples) and advance every track to
        `watermark`; returns the intervals that closed and, per device, how many samples were
        too late to apply. A track with neither a state nor pending samples is dropped (only
        disconnects of a client that never reported: no device)."""
        closed: list[Interval] = []
        late: dict[str, int] = {}
        for device in samples.keys() - self.tracks.keys():
            self.tracks[device] = DeviceTrack(device, shifts=self.shifts)
        for device, track in list(self.tracks.items()):
            done, too_late = track.advance(samples.get(device, ()), watermark)
            closed.extend(done)
            if too_late:
                late[device] = too_late
            if track.state is None and not track.pending:
                del self.tracks[device]
        return closed, late

    @property
    def due(self) -> int | None:
        """The earliest `DeviceTrack.due` of the bucket: when Spark must call it again."""
        return min((d for t in self.tracks.values() if (d := t.due) is not None), default=None)

    def to_json(self) -> str:
        return json.dumps(
            {device: track.to_state() for device, track in self.tracks.items()},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, shifts: Shifts | None = None) -> BucketTracks:
        return cls(
            shifts,
            {
                device: DeviceTrack.from_state(device, data, shifts)
                for device, data in json.loads(text).items()
            },
        )


def days_touched(intervals: Iterable[tuple[str, int, int]], shifts: Shifts) -> set[str]:
    """The days whose daily tables new closed intervals change, from (kind, start ms, end ms):
    every shift date a state interval overlaps (availability is per shift, and an interval
    can run across midnight into the next day's shifts), and the local start date of an alarm
    (the alarm summary counts an alarm on the plant's day it began)."""
    days: set[str] = set()
    for kind, start, end in intervals:
        if kind == "state":
            days.update(piece.shift_date for piece in shifts.pieces(start, end))
        else:
            days.add(shifts.local_date(start).isoformat())
    return days


def batch_intervals(
    device: str,
    samples: Sequence[Sample],
    shifts: Shifts | None = None,
    horizon: int | None = None,
) -> list[Interval]:
    """Every closed interval of a device's samples at once (a back-fill); with `shifts`, the
    running state is cut at the shift starts before `horizon` (the end of the back-fill's
    data), as a stream whose watermark reached it would have."""
    track = DeviceTrack(device, shifts=shifts)
    if horizon is None:
        horizon = max((s.ts for s in samples), default=0)
    closed, _ = track.advance(samples, watermark=2**62, horizon=horizon)
    return closed
