"""The plant's shift calendar: shifts in local time with daylight saving, planned downtime, and
the days the daily tables are cut by."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark.intervals import days_touched
from spark.shifts import Downtime, Piece, Shifts

HOUR = 3_600_000
T0 = int(datetime(2026, 1, 5, 6, 0, tzinfo=UTC).timestamp() * 1000)


def ms(text: str) -> int:
    """Epoch ms of an ISO time, UTC unless it names its offset."""
    value = datetime.fromisoformat(text)
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)


def test_an_interval_across_the_night_shift_is_cut_at_each_shift_start() -> None:
    pieces = Shifts().pieces(ms("2026-01-05T21:00"), ms("2026-01-06T07:00"))
    assert pieces == [
        Piece("2026-01-05", 2, ms("2026-01-05T14:00"), HOUR, 8 * HOUR),
        Piece("2026-01-05", 3, ms("2026-01-05T22:00"), 8 * HOUR, 8 * HOUR),
        Piece("2026-01-06", 1, ms("2026-01-06T06:00"), HOUR, 8 * HOUR),
    ]


def test_the_night_shift_belongs_to_the_day_it_began() -> None:
    pieces = Shifts().pieces(ms("2026-01-06T01:00"), ms("2026-01-06T02:00"))
    assert pieces == [Piece("2026-01-05", 3, ms("2026-01-05T22:00"), HOUR, 8 * HOUR)]


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
"""Whole-hour DST, the other hemisphere's DST at another hour, a half-hour offset, and a
half-hour DST shift."""


@given(
    st.integers(0, 400 * 86_400_000),
    st.integers(1, 3 * 86_400_000),
    st.sampled_from(ZONES),
    st.sampled_from(["07:30,19:30", "06:00,14:00,22:00", "02:30", "00:00,02:00,03:00"]),
)
def test_shift_pieces_add_up_to_the_interval_in_any_zone(
    offset: int, length: int, zone: str, starts: str
) -> None:
    start = T0 + offset
    pieces = Shifts.parse(starts, zone).pieces(start, start + length)
    assert sum(p.ms for p in pieces) == length
    assert all(0 < p.ms <= p.planned_ms for p in pieces)
    assert [p.shift_start for p in pieces] == sorted({p.shift_start for p in pieces})


@given(st.integers(0, 400 * 86_400_000), st.sampled_from(ZONES))
def test_shifts_follow_each_other_without_gap_and_last_from_one_minute_to_25_hours(
    offset: int, zone: str
) -> None:
    shifts = Shifts.parse("06:00,14:00,22:00", zone)
    bounds = shifts.boundaries(T0 + offset, T0 + offset + 4 * 86_400_000)
    for (begin, _, _), (after, _, _) in pairwise(bounds):
        assert after == shifts.next_start_after(begin)
        assert 60_000 <= after - begin <= 25 * HOUR


def test_on_the_nights_the_clocks_change_the_night_shift_lasts_7_and_9_hours() -> None:
    berlin = Shifts(timezone="Europe/Berlin")
    spring = berlin.pieces(ms("2026-03-28T22:00+01:00"), ms("2026-03-29T06:00+02:00"))
    autumn = berlin.pieces(ms("2026-10-24T22:00+02:00"), ms("2026-10-25T06:00+01:00"))
    assert spring == [Piece("2026-03-28", 3, ms("2026-03-28T21:00"), 7 * HOUR, 7 * HOUR)]
    assert autumn == [Piece("2026-10-24", 3, ms("2026-10-24T20:00"), 9 * HOUR, 9 * HOUR)]


def test_a_skipped_local_time_moves_forward_by_the_gap_and_a_repeated_one_is_its_first() -> None:
    berlin = Shifts.parse("02:30", "Europe/Berlin")
    assert berlin.at(date(2026, 3, 29), 150) == ms("2026-03-29T03:30+02:00")
    assert berlin.at(date(2026, 10, 25), 150) == ms("2026-10-25T02:30+02:00")


def test_shifts_are_named_by_the_plants_local_date() -> None:
    tokyo = Shifts(timezone="Asia/Tokyo")
    # 06:00 in Tokyo on the 6th is 21:00 UTC on the 5th.
    (piece,) = tokyo.pieces(ms("2026-01-05T21:00"), ms("2026-01-05T22:00"))
    assert (piece.shift_date, piece.shift) == ("2026-01-06", 1)
    assert days_touched([("alarm", ms("2026-01-05T21:00"), ms("2026-01-05T22:00"))], tokyo) == {
        "2026-01-06"
    }


def test_planned_downtime_is_left_out_of_the_pieces_and_of_the_planned_time() -> None:
    shifts = Shifts(
        timezone="Europe/Berlin",
        downtime=(Downtime.parse("12:00-12:30"), Downtime.parse("Sun 00:00-24:00")),
    )
    # Saturday 10 January, the early shift 06:00-14:00 Berlin time, with its lunch break.
    (early,) = shifts.pieces(ms("2026-01-10T06:00+01:00"), ms("2026-01-10T14:00+01:00"))
    assert (early.ms, early.planned_ms) == (7.5 * HOUR, 7.5 * HOUR)
    # Saturday's night shift plans 22:00-24:00 only, Sunday's 00:00-06:00 of Monday only;
    # Sunday's early and late shifts plan nothing and are left out.
    pieces = shifts.pieces(ms("2026-01-10T22:00+01:00"), ms("2026-01-12T06:00+01:00"))
    assert [(p.shift_date, p.shift, p.ms, p.planned_ms) for p in pieces] == [
        ("2026-01-10", 3, 2 * HOUR, 2 * HOUR),
        ("2026-01-11", 3, 6 * HOUR, 6 * HOUR),
    ]


def test_a_downtime_window_past_midnight_runs_into_the_next_day() -> None:
    shifts = Shifts(downtime=(Downtime.parse("2026-01-05 22:00-02:00"),))
    assert shifts.planned_down(ms("2026-01-05T00:00"), ms("2026-01-07T00:00")) == [
        (ms("2026-01-05T22:00"), ms("2026-01-06T02:00"))
    ]
    assert shifts.planned_ms(ms("2026-01-05T22:00")) == 4 * HOUR


def test_overlapping_downtime_windows_count_once() -> None:
    shifts = Shifts(downtime=(Downtime.parse("Mon-Fri 12:00-13:00"), Downtime.parse("12:30-12:45")))
    assert shifts.planned_ms(ms("2026-01-05T06:00")) == 7 * HOUR  # a Monday
    assert shifts.planned_ms(ms("2026-01-10T06:00")) == 8 * HOUR - 15 * 60_000  # a Saturday


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("12:00", "expected HH:MM-HH:MM"),
        ("12:00-12:00", "empty window"),
        ("12:00-25:00", "not a time of day"),
        ("Funday 12:00-13:00", "expected a weekday"),
        ("Mon Tue 12:00-13:00", r"expected \[DAYS\|DATE\]"),
        ("12:0-13:00", "expected HH:MM"),
    ],
)
def test_bad_downtime_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Downtime.parse(text)


def test_weekday_ranges_may_wrap_over_the_weekend() -> None:
    assert Downtime.parse("Fri-Mon 00:00-24:00").weekdays == {4, 5, 6, 0}
    assert Downtime.parse("sat,sun 00:00-24:00").weekdays == {5, 6}


def test_an_unknown_time_zone_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Europe/Gotham'"):
        Shifts(timezone="Europe/Gotham")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "expected HH:MM"),
        ("6", "expected HH:MM"),
        ("ab:cd", "expected HH:MM"),
        ("ab:30", "expected HH:MM"),
        ("06:xy", "expected HH:MM"),
        ("25:00", "not a time of day"),
        ("24:00", "not a time of day"),
        ("06:00,06:00", "distinct"),
    ],
)
def test_bad_shift_starts_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Shifts.parse(text)


def test_shift_starts_are_minutes_of_the_day_in_order_from_midnight_to_23_59() -> None:
    assert Shifts.parse("22:00, 06:30,14:15").starts_minutes == (390, 855, 1320)
    assert Shifts.parse("00:00,23:59").starts_minutes == (0, 1439)


def test_shift_boundaries_start_at_the_shift_the_interval_begins_in() -> None:
    start = ms("2026-01-06T07:00")
    bounds = Shifts().boundaries(start, ms("2026-01-06T22:00"))
    assert bounds == [
        (ms("2026-01-06T06:00"), "2026-01-06", 1),
        (ms("2026-01-06T14:00"), "2026-01-06", 2),
    ]


def test_shifts_are_cut_in_the_plants_zone_whatever_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        pieces = Shifts().pieces(ms("2026-01-06T01:00"), ms("2026-01-06T02:00"))
        alarm_day = days_touched(
            [("alarm", ms("2026-01-06T20:00"), ms("2026-01-06T21:00"))], Shifts()
        )
    finally:
        monkeypatch.undo()
        time.tzset()
    assert pieces == [Piece("2026-01-05", 3, ms("2026-01-05T22:00"), HOUR, 8 * HOUR)]
    assert alarm_day == {"2026-01-06"}


def test_an_interval_across_midnight_touches_the_next_days_shifts_too() -> None:
    days = days_touched([("state", ms("2026-01-05T21:00"), ms("2026-01-06T07:00"))], Shifts())
    assert days == {"2026-01-05", "2026-01-06"}
    # 01:00-02:00 is the night shift that began the day before.
    assert days_touched([("state", ms("2026-01-06T01:00"), ms("2026-01-06T02:00"))], Shifts()) == {
        "2026-01-05"
    }
    assert days_touched([("alarm", ms("2026-01-06T01:00"), ms("2026-01-07T02:00"))], Shifts()) == {
        "2026-01-06"
    }


def test_the_calendar_agrees_with_zoneinfo_on_every_shift_start_of_a_year() -> None:
    shifts = Shifts(timezone="America/New_York")
    zone = ZoneInfo("America/New_York")
    first = ms("2026-01-01T12:00")
    for begin, iso, number in shifts.boundaries(first, first + 365 * 86_400_000):
        local = datetime.fromtimestamp(begin / 1000, tz=zone)
        if begin >= first:
            assert local.date().isoformat() == iso
            assert (local.hour, local.minute) == divmod(shifts.starts_minutes[number - 1], 60)
