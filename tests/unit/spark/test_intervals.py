"""The interval builder and shift cutting behind the state, alarm and availability tables."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark.intervals import DeviceTrack, Interval, Sample, Shifts, batch_intervals, days_touched

T0 = int(datetime(2026, 1, 5, 6, 0, tzinfo=UTC).timestamp() * 1000)


def sample(ts: int, seq: int, state: str = "RUNNING", alarms: tuple[str, ...] = ()) -> Sample:
    return Sample(T0 + ts, seq, state, frozenset(alarms), "L1", "S1")


def reference_intervals(device: str, samples: list[Sample]) -> list[Interval]:
    """A plain restatement of the rules, to check the builder against."""
    ordered = sorted({(s.ts, s.seq): s for s in samples}.values(), key=lambda s: (s.ts, s.seq))
    out = []
    for prev_index, current in enumerate(ordered[1:]):
        run_start = None
        # The state interval that `current` closes started at the first sample of the run.
        if current.state != ordered[prev_index].state:
            j = prev_index
            while j > 0 and ordered[j - 1].state == ordered[prev_index].state:
                j -= 1
            run_start = ordered[j].ts
            out.append(
                Interval(
                    "state", device, "L1", "S1", ordered[prev_index].state, run_start, current.ts
                )
            )
        for code in sorted(ordered[prev_index].alarms - current.alarms):
            j = prev_index
            while j > 0 and code in ordered[j - 1].alarms:
                j -= 1
            out.append(Interval("alarm", device, "L1", "S1", code, ordered[j].ts, current.ts))
    return out


def key(interval: Interval) -> tuple[object, ...]:
    return (interval.kind, interval.what, interval.start, interval.end)


def test_a_state_interval_runs_from_first_report_to_first_different_report() -> None:
    samples = [
        sample(0, 0, "RUNNING"),
        sample(5000, 1, "RUNNING"),
        sample(7000, 2, "DOWN", ("E101",)),
        sample(12000, 3, "DOWN", ("E101",)),
        sample(15000, 4, "RUNNING"),
    ]
    closed = batch_intervals("d1", samples)
    assert [(i.kind, i.what, i.start - T0, i.end - T0) for i in closed] == [
        ("state", "RUNNING", 0, 7000),
        ("state", "DOWN", 7000, 15000),
        ("alarm", "E101", 7000, 15000),
    ]


def test_the_running_interval_is_not_emitted_until_it_closes() -> None:
    assert batch_intervals("d1", [sample(0, 0), sample(5000, 1)]) == []


def test_pending_samples_wait_for_the_watermark_and_apply_in_device_time_order() -> None:
    track = DeviceTrack("d1")
    # Out of order, as when a device's messages sit in different RocketMQ queues.
    closed, late = track.advance([sample(7000, 2, "DOWN"), sample(0, 0)], watermark=T0 + 1000)
    assert (closed, late) == ([], 0)
    assert track.next_due == T0 + 7000
    closed, late = track.advance([sample(5000, 1)], watermark=T0 + 60_000)
    assert [(i.what, i.start - T0, i.end - T0) for i in closed] == [("RUNNING", 0, 7000)]
    assert late == 0 and track.next_due is None


def test_a_sample_older_than_one_already_applied_is_counted_late_and_left_out() -> None:
    track = DeviceTrack("d1")
    track.advance([sample(0, 0), sample(9000, 5, "IDLE")], watermark=T0 + 10_000)
    closed, late = track.advance([sample(4000, 3, "DOWN")], watermark=T0 + 10_000)
    assert (closed, late) == ([], 1)


def test_a_sample_is_late_only_if_it_comes_before_the_last_applied_in_time_then_sequence() -> None:
    track = DeviceTrack("d1")
    track.advance([sample(1000, 5)], watermark=T0 + 1000)
    _, late = track.advance([sample(1000, 6, "IDLE"), sample(2000, 1, "DOWN")], watermark=T0)
    assert late == 0 and len(track.pending) == 2
    _, late = track.advance([sample(1000, 4, "SETUP"), sample(999, 9, "SETUP")], watermark=T0)
    assert late == 2


def test_intervals_name_the_device_line_and_station_they_belong_to() -> None:
    (interval,) = batch_intervals("d7", [sample(0, 0), sample(5000, 1, "IDLE")])
    assert interval == Interval("state", "d7", "L1", "S1", "RUNNING", T0, T0 + 5000)


def test_a_retransmitted_sample_is_taken_once() -> None:
    track = DeviceTrack("d1")
    _, late = track.advance(
        [sample(0, 0), sample(0, 0), sample(3000, 1, "IDLE"), sample(3000, 1, "IDLE")],
        watermark=T0,
    )
    assert late == 0 and len(track.pending) == 1


samples_strategy = st.lists(
    st.tuples(
        st.integers(0, 600),
        st.sampled_from(["RUNNING", "IDLE", "DOWN", "SETUP"]),
        st.frozensets(st.sampled_from(["E101", "W201", "W305"]), max_size=2),
    ),
    min_size=1,
    max_size=40,
)


def build(steps: list[tuple[int, str, frozenset[str]]]) -> list[Sample]:
    """Samples with non-decreasing device time (gaps in seconds) and seq +1 each."""
    out, ts = [], 0
    for seq, (gap, state, alarms) in enumerate(steps):
        ts += gap * 1000
        out.append(Sample(T0 + ts, seq, state, alarms, "L1", "S1"))
    return out


@settings(max_examples=200, deadline=None)
@given(samples_strategy)
def test_batch_intervals_match_the_reference_rules(steps: list) -> None:
    samples = build(steps)
    assert sorted(map(key, batch_intervals("d", samples))) == sorted(
        map(key, reference_intervals("d", samples))
    )


@settings(max_examples=200, deadline=None)
@given(samples_strategy, st.data())
def test_streaming_in_any_chunks_within_the_watermark_equals_the_back_fill(
    steps: list, data: st.DataObject
) -> None:
    samples = build(steps)
    lateness = 120_000
    # Deliver in chunks, each chunk shuffled; the watermark trails the newest time seen by
    # `lateness`, and no sample arrives after the watermark has passed it.
    order = data.draw(st.permutations(range(len(samples))))
    order = sorted(order, key=lambda i: samples[i].ts + data.draw(st.integers(0, lateness // 2)))
    track = DeviceTrack("d")
    streamed: list[Interval] = []
    newest = 0
    index = 0
    delivered: list[Sample] = []
    while index < len(order):
        size = data.draw(st.integers(1, 5))
        chunk = [samples[i] for i in order[index : index + size]]
        index += size
        if any(s.ts < newest - lateness for s in chunk):
            continue  # Spark would drop these before the operator; not this property's case
        newest = max(newest, *(s.ts for s in chunk))
        delivered.extend(chunk)
        state = track.to_json()  # the track survives the state store round trip
        track = DeviceTrack.from_json("d", state)
        closed, late = track.advance(chunk, newest - lateness)
        assert late == 0
        streamed.extend(closed)
    closed, _ = track.advance([], 2**62)  # the watermark passes everything
    streamed.extend(closed)
    assert sorted(map(key, streamed)) == sorted(map(key, batch_intervals("d", delivered)))


def test_track_json_round_trip_keeps_pending_samples_and_open_alarms() -> None:
    track = DeviceTrack("d1")
    track.advance([sample(0, 0, alarms=("W201",)), sample(9000, 1, "IDLE")], watermark=T0)
    again = DeviceTrack.from_json("d1", track.to_json())
    assert again == track
    assert json.loads(track.to_json())["alarms"] == {"W201": T0}


# --- shifts ---------------------------------------------------------------------------------


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_an_interval_across_the_night_shift_is_cut_at_each_shift_start() -> None:
    pieces = Shifts().pieces(ms("2026-01-05T21:00"), ms("2026-01-06T07:00"))
    assert pieces == [
        ("2026-01-05", 2, ms("2026-01-05T14:00"), 3_600_000),
        ("2026-01-05", 3, ms("2026-01-05T22:00"), 8 * 3_600_000),
        ("2026-01-06", 1, ms("2026-01-06T06:00"), 3_600_000),
    ]


def test_the_night_shift_belongs_to_the_day_it_began() -> None:
    pieces = Shifts().pieces(ms("2026-01-06T01:00"), ms("2026-01-06T02:00"))
    assert pieces == [("2026-01-05", 3, ms("2026-01-05T22:00"), 3_600_000)]


@given(st.integers(0, 10 * 86_400_000), st.integers(1, 3 * 86_400_000))
def test_shift_pieces_add_up_to_the_interval(offset: int, length: int) -> None:
    start = T0 + offset
    pieces = Shifts.parse("07:30,19:30").pieces(start, start + length)
    assert sum(p[3] for p in pieces) == length
    assert all(p[3] > 0 for p in pieces)


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


def test_shift_boundaries_reach_back_no_further_than_the_day_before_and_stop_before_the_end() -> (
    None
):
    start = ms("2026-01-06T07:00")
    bounds = Shifts().boundaries(start, ms("2026-01-06T22:00"))
    assert bounds[-3:] == [
        (ms("2026-01-05T22:00"), "2026-01-05", 3),
        (ms("2026-01-06T06:00"), "2026-01-06", 1),
        (ms("2026-01-06T14:00"), "2026-01-06", 2),
    ]
    assert ms("2026-01-05T00:00") <= bounds[0][0]


def test_shifts_are_cut_in_utc_whatever_the_machines_time_zone(
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
    assert pieces == [("2026-01-05", 3, ms("2026-01-05T22:00"), 3_600_000)]
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
