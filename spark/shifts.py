"""Factory time: shifts in the plant's time zone, with its daylight-saving rules, and planned
downtime.

A plant works to its own clock. `Shifts` says when each shift starts as local wall-clock times
(06:00, 14:00, 22:00 by default) in a named IANA time zone (`Europe/Berlin`; UTC by default), and
which local times are planned downtime: breaks, weekends, holidays (`Downtime`). Everything
else works in epoch milliseconds, so the calendar is where local time turns into instants:

* A shift is named by the local date it starts on and its number (1 = the first start time of
  the day), so the night shift 22:00-06:00 belongs to the day it began. A shift ends where the
  next one starts: on the night the clocks go forward the night shift lasts 7 hours, on the night
  they go back 9.
* A local time the clocks skip (02:30 on the spring-forward night in Berlin) is moved forward by
  the length of the gap (03:30), and a local time that happens twice is its first occurrence:
  the rules of Python's zoneinfo with fold=0 and of java.time.
* Planned downtime is time inside a shift in which the plant did not plan to produce; it counts
  toward neither a machine's availability nor against it (`pieces`, `planned_ms`).

Pure code, no Spark: the tables, the stream's interval tracks and the tests share it. The time
zone database is the system's (Debian's tzdata), or the `tzdata` package where there is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MINUTES_PER_DAY = 24 * 60
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _clock(text: str, *, allow_end_of_day: bool = False) -> int:
    """Minutes since midnight of "HH:MM" (raises ValueError); "24:00" only as an end."""
    hours, sep, mins = text.strip().partition(":")
    if not sep or not hours.isdigit() or not mins.isdigit() or len(mins) != 2:
        raise ValueError(f"{text.strip()!r}: expected HH:MM")
    value = int(hours) * 60 + int(mins)
    limit = MINUTES_PER_DAY if allow_end_of_day else MINUTES_PER_DAY - 1
    if int(mins) >= 60 or not 0 <= value <= limit:
        raise ValueError(f"{text.strip()!r} is not a time of day")
    return value


def _weekdays(text: str) -> frozenset[int]:
    """ "Mon", "Mon-Fri", "Sat,Sun" -> weekday numbers (Monday = 0), or ValueError."""
    days: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        try:
            lo = WEEKDAYS.index(first.strip().capitalize())
            hi = WEEKDAYS.index(last.strip().capitalize()) if dash else lo
        except ValueError:
            raise ValueError(
                f"{part.strip()!r}: expected a weekday ({', '.join(WEEKDAYS)}), a range like "
                "Mon-Fri, or an ISO date"
            ) from None
        days.update(range(lo, hi + 1) if lo <= hi else [*range(lo, 7), *range(0, hi + 1)])
    return frozenset(days)


@dataclass(frozen=True, slots=True)
class Downtime:
    """A window of planned downtime in local time: from `start` to `end` minutes of the day,
    on every day, on some weekdays (`weekdays`, Monday = 0) or on one date (`on`). An end at
    or before the start runs into the next day (22:00-06:00); "00:00-24:00" is the whole day.
    A window belongs to the day it starts on."""

    start: int
    end: int
    weekdays: frozenset[int] = frozenset()
    on: date | None = None

    @classmethod
    def parse(cls, text: str) -> Downtime:
        """From "12:00-12:30" (every day), "Sat,Sun 00:00-24:00", "Mon-Fri 09:00-09:15" or
        "2026-12-24 14:00-24:00" (raises ValueError saying what is wrong)."""
        words = text.split()
        if len(words) not in (1, 2):
            raise ValueError(f"{text!r}: expected [DAYS|DATE] HH:MM-HH:MM")
        span = words[-1]
        first, dash, last = span.partition("-")
        if not dash:
            raise ValueError(f"{span!r}: expected HH:MM-HH:MM")
        start, end = _clock(first), _clock(last, allow_end_of_day=True)
        if start == end:
            raise ValueError(f"{span!r}: an empty window (the whole day is 00:00-24:00)")
        weekdays: frozenset[int] = frozenset()
        on = None
        if len(words) == 2:
            try:
                on = date.fromisoformat(words[0])
            except ValueError:
                weekdays = _weekdays(words[0])
        return cls(start, end, weekdays, on)

    def applies_on(self, day: date) -> bool:
        if self.on is not None:
            return day == self.on
        return not self.weekdays or day.weekday() in self.weekdays

    @property
    def minutes(self) -> int:
        """How long the window is, in minutes of wall-clock time."""
        return (self.end - self.start) % MINUTES_PER_DAY or MINUTES_PER_DAY


class Piece(NamedTuple):
    """The part of an interval inside one shift."""

    shift_date: str
    """The local date the shift started on (ISO)."""
    shift: int
    """The shift's number: 1 = the first start time of the day."""
    shift_start: int
    """When the shift started (epoch ms)."""
    ms: int
    """Milliseconds of the interval inside the shift and outside planned downtime."""
    planned_ms: int
    """The shift's planned production time: its length less its planned downtime."""


@dataclass(frozen=True, slots=True)
class Shifts:
    """A plant's shift calendar: shift start times of the day (minutes since local midnight),
    its time zone, and its planned downtime."""

    starts_minutes: tuple[int, ...] = (6 * 60, 14 * 60, 22 * 60)
    timezone: str = "UTC"
    downtime: tuple[Downtime, ...] = ()

    def __post_init__(self) -> None:
        zone(self.timezone)  # an unknown zone fails here, not inside a job

    @classmethod
    def parse(cls, text: str, timezone: str = "UTC", downtime: tuple[Downtime, ...] = ()) -> Shifts:
        """From "06:00,14:00,22:00" (raises ValueError)."""
        minutes = [_clock(part) for part in text.split(",")]
        if len(set(minutes)) != len(minutes):
            raise ValueError("shift starts must be distinct")
        return cls(tuple(sorted(minutes)), timezone, downtime)

    # -- local time to instants

    def at(self, day: date, minute: int) -> int:
        """Epoch ms of local wall-clock time `minute` (0-1440) of `day`: a time the clocks skip
        is moved forward by the gap, a repeated one is its first occurrence."""
        day = day + timedelta(days=minute // MINUTES_PER_DAY)
        minute %= MINUTES_PER_DAY
        local = datetime(day.year, day.month, day.day, minute // 60, minute % 60,
                         tzinfo=zone(self.timezone))  # fmt: skip
        return int(local.timestamp() * 1000)

    def local_date(self, ms: int) -> date:
        """The plant's local date at instant `ms`."""
        return datetime.fromtimestamp(ms / 1000, tz=zone(self.timezone)).date()

    # -- shifts

    def _starts_from(self, day: date) -> list[tuple[int, str, int]]:
        return [(self.at(day, m), day.isoformat(), n)
                for n, m in enumerate(self.starts_minutes, start=1)]  # fmt: skip

    def boundaries(self, start_ms: int, end_ms: int) -> list[tuple[int, str, int]]:
        """(shift start ms, shift date ISO, shift number) of every shift overlapping
        [start_ms, end_ms), in order; the first starts at or before `start_ms`."""
        day = self.local_date(start_ms) - timedelta(days=1)
        out: list[tuple[int, str, int]] = []
        while True:
            for begin, iso, number in self._starts_from(day):
                if begin >= end_ms and out:
                    return out
                if out and begin <= out[-1][0]:
                    continue  # two starts the clocks made one instant: the first counts
                if begin <= start_ms:
                    out = []  # a later start still at or before the interval's
                out.append((begin, iso, number))
            day += timedelta(days=1)

    def next_start_after(self, ms: int) -> int:
        """The first shift start after instant `ms`."""
        day = self.local_date(ms) - timedelta(days=1)
        while True:
            for begin, _, _ in self._starts_from(day):
                if begin > ms:
                    return begin
            day += timedelta(days=1)

    def _shift_spans(self, start_ms: int, end_ms: int) -> list[tuple[int, int, str, int]]:
        """(begin, end, date, number) of each shift overlapping [start_ms, end_ms)."""
        bounds = self.boundaries(start_ms, end_ms)
        spans = []
        for i, (begin, iso, number) in enumerate(bounds):
            end = bounds[i + 1][0] if i + 1 < len(bounds) else self.next_start_after(begin)
            spans.append((begin, end, iso, number))
        return spans

    def planned_down(self, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
        """The planned downtime within [start_ms, end_ms), as sorted disjoint [lo, hi)."""
        if not self.downtime or start_ms >= end_ms:
            return []
        windows = []
        day = self.local_date(start_ms) - timedelta(days=1)
        last = self.local_date(end_ms)
        while day <= last:
            for window in self.downtime:
                if window.applies_on(day):
                    lo = self.at(day, window.start)
                    hi = self.at(day, window.start + window.minutes)
                    lo, hi = max(lo, start_ms), min(hi, end_ms)
                    if lo < hi:
                        windows.append((lo, hi))
            day += timedelta(days=1)
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(windows):
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return merged

    def _productive_ms(self, lo: int, hi: int) -> int:
        return hi - lo - sum(b - a for a, b in self.planned_down(lo, hi))

    def planned_ms(self, shift_start: int) -> int:
        """The planned production time of the shift starting at `shift_start`: its length less
        its planned downtime."""
        return self._productive_ms(shift_start, self.next_start_after(shift_start))

    def pieces(self, start_ms: int, end_ms: int) -> list[Piece]:
        """[start_ms, end_ms) cut at shift starts: one `Piece` per shift it overlaps, with the
        milliseconds inside that shift outside planned downtime (a piece wholly in planned
        downtime is left out)."""
        out = []
        for begin, end, iso, number in self._shift_spans(start_ms, end_ms):
            lo, hi = max(begin, start_ms), min(end, end_ms)
            if lo < hi:
                ms = self._productive_ms(lo, hi)
                if ms > 0:
                    out.append(Piece(iso, number, begin, ms, self._productive_ms(begin, end)))
        return out


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`, or ValueError naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name like Europe/Berlin)") from None
