"""The interval builder behind the state and alarm tables: states, alarms, the watermark, and
states cut at shift starts."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from spark.intervals import BucketTracks, DeviceTrack, Interval, Sample, batch_intervals
from spark.shifts import Shifts

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


def stored(track: DeviceTrack) -> dict:
    """The track's state form as it comes back from the state store (through JSON)."""
    return json.loads(json.dumps(track.to_state()))


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


LATENESS = 120_000
"""The watermark's delay in the streaming properties."""


def stream_in_chunks(
    samples: list[Sample], data: st.DataObject, shifts: Shifts | None
) -> tuple[DeviceTrack, list[Interval], list[Sample], int]:
    """Deliver `samples` to a track in chunks of 1-5, each shuffled within half the lateness,
    the track going through its state-store form between chunks; the watermark trails the
    newest time seen by LATENESS, and a chunk with a sample behind it is left out (Spark
    drops such rows before the operator). Returns the track, the intervals it closed, the
    samples delivered and the newest time seen."""
    order = data.draw(st.permutations(range(len(samples))))
    order = sorted(order, key=lambda i: samples[i].ts + data.draw(st.integers(0, LATENESS // 2)))
    track = DeviceTrack("d", shifts=shifts)
    streamed: list[Interval] = []
    delivered: list[Sample] = []
    newest, index = 0, 0
    while index < len(order):
        size = data.draw(st.integers(1, 5))
        chunk = [samples[i] for i in order[index : index + size]]
        index += size
        if any(s.ts < newest - LATENESS for s in chunk):
            continue
        newest = max(newest, *(s.ts for s in chunk))
        delivered.extend(chunk)
        track = DeviceTrack.from_state("d", stored(track), shifts)
        closed, late = track.advance(chunk, newest - LATENESS)
        assert late == 0
        streamed.extend(closed)
    return track, streamed, delivered, newest


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
    track, streamed, delivered, _ = stream_in_chunks(build(steps), data, None)
    closed, _ = track.advance([], 2**62)  # the watermark passes everything
    streamed.extend(closed)
    assert sorted(map(key, streamed)) == sorted(map(key, batch_intervals("d", delivered)))


@settings(max_examples=150, deadline=None)
@given(st.lists(samples_strategy, min_size=1, max_size=3), st.data())
def test_a_bucket_of_devices_closes_what_each_device_track_alone_closes(
    devices_steps: list[list], data: st.DataObject
) -> None:
    """The stream keeps a bucket of devices per state row, advancing every track at each call;
    each device's own track, advanced only when it has samples or its `due` has passed (as a
    per-device timeout would), must close the same intervals."""
    shifts = data.draw(st.sampled_from([None, BERLIN]))
    arrivals = [(f"d{n}", s) for n, steps in enumerate(devices_steps) for s in build(steps)]
    jitter = {id(s): data.draw(st.integers(0, LATENESS // 2)) for _, s in arrivals}
    arrivals.sort(key=lambda pair: pair[1].ts + jitter[id(pair[1])])
    bucket = BucketTracks(shifts)
    alone = {device: DeviceTrack(device, shifts=shifts) for device, _ in arrivals}
    from_bucket: list[Interval] = []
    from_alone: list[Interval] = []
    newest, index = 0, 0
    while index < len(arrivals):
        size = data.draw(st.integers(1, 8))
        chunk = arrivals[index : index + size]
        index += size
        if any(s.ts < newest - LATENESS for _, s in chunk):
            continue  # Spark drops rows behind the watermark before the operator
        newest = max(newest, *(s.ts for _, s in chunk))
        watermark = newest - LATENESS
        by_device: dict[str, list[Sample]] = {}
        for device, s in chunk:
            by_device.setdefault(device, []).append(s)
        bucket = BucketTracks.from_json(bucket.to_json(), shifts)
        closed, late = bucket.advance(by_device, watermark)
        assert late == {}
        from_bucket.extend(closed)
        for device, track in alone.items():
            due = track.due
            if device in by_device or (due is not None and due <= watermark):
                closed, _ = track.advance(by_device.get(device, []), watermark)
                from_alone.extend(closed)
        dues = [d for d in (t.due for t in alone.values()) if d is not None]
        assert bucket.due == (min(dues) if dues else None)
    closed, _ = bucket.advance({}, newest)
    from_bucket.extend(closed)
    for track in alone.values():
        from_alone.extend(track.advance([], newest)[0])

    def keys(intervals: list[Interval]) -> list[tuple[object, ...]]:
        return sorted((i.device, i.closed_by, *key(i)) for i in intervals)

    assert keys(from_bucket) == keys(from_alone)


def test_a_copy_of_the_sample_applied_last_is_neither_applied_again_nor_counted_late() -> None:
    track = DeviceTrack("d1")
    offline = Sample(T0 + 5000, -(T0 + 5000), "OFFLINE", frozenset(), "", "")
    track.advance([sample(0, 0), offline], watermark=T0 + 5000)
    assert track.advance([offline], watermark=T0 + 6000) == ([], 0)
    closed, late = track.advance([sample(4000, 1)], watermark=T0 + 6000)
    assert (closed, late) == ([], 1), "an older report than the last applied is late"


def test_track_json_round_trip_keeps_pending_samples_and_open_alarms() -> None:
    track = DeviceTrack("d1")
    track.advance([sample(0, 0, alarms=("W201",)), sample(9000, 1, "IDLE")], watermark=T0)
    again = DeviceTrack.from_state("d1", stored(track))
    assert again == track
    assert stored(track)["alarms"] == {"W201": T0}


# --- shifts ---------------------------------------------------------------------------------


# --- states cut at shift starts ---------------------------------------------------------------

BERLIN = Shifts(timezone="Europe/Berlin")
"""06:00, 14:00 and 22:00 in Berlin: 05:00, 13:00 and 21:00 UTC in January."""


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_a_machine_down_for_whole_shifts_shows_in_each_once_the_watermark_passes_its_end() -> None:
    track = DeviceTrack("d", shifts=BERLIN)
    down = Sample(utc("2026-01-05T04:00"), 0, "DOWN", frozenset(), "L1", "S1")
    closed, _ = track.advance([down], utc("2026-01-05T04:30"))
    assert closed == []
    closed, _ = track.advance([], utc("2026-01-05T21:30"))
    assert [(i.what, i.start, i.end, i.closed_by) for i in closed] == [
        ("DOWN", utc("2026-01-05T04:00"), utc("2026-01-05T05:00"), "shift_end"),
        ("DOWN", utc("2026-01-05T05:00"), utc("2026-01-05T13:00"), "shift_end"),
        ("DOWN", utc("2026-01-05T13:00"), utc("2026-01-05T21:00"), "shift_end"),
    ]
    assert track.next_cut == utc("2026-01-06T05:00")
    running = Sample(utc("2026-01-05T23:00"), 1, "RUNNING", frozenset(), "L1", "S1")
    closed, _ = track.advance([running], utc("2026-01-05T23:30"))
    assert [(i.what, i.start, i.end, i.closed_by) for i in closed] == [
        ("DOWN", utc("2026-01-05T21:00"), utc("2026-01-05T23:00"), "change"),
    ]


def test_a_state_is_cut_only_once_the_watermark_is_past_the_shift_start() -> None:
    track = DeviceTrack("d", shifts=BERLIN)
    track.advance([Sample(utc("2026-01-05T04:00"), 0, "IDLE", frozenset(), "L1", "S1")], 0)
    assert track.advance([], utc("2026-01-05T05:00"))[0] == []  # at the start, not past it
    (cut,), _ = track.advance([], utc("2026-01-05T05:00") + 1)
    assert (cut.start, cut.end) == (utc("2026-01-05T04:00"), utc("2026-01-05T05:00"))


def test_alarms_are_not_cut_at_shift_starts() -> None:
    samples = [
        Sample(utc("2026-01-05T04:00"), 0, "DOWN", frozenset({"E101"}), "L1", "S1"),
        Sample(utc("2026-01-05T06:00"), 1, "RUNNING", frozenset(), "L1", "S1"),
    ]
    closed = batch_intervals("d", samples, BERLIN)
    assert [(i.kind, i.start, i.end) for i in closed if i.kind == "alarm"] == [
        ("alarm", utc("2026-01-05T04:00"), utc("2026-01-05T06:00"))
    ]
    assert [(i.start, i.end, i.closed_by) for i in closed if i.kind == "state"] == [
        (utc("2026-01-05T04:00"), utc("2026-01-05T05:00"), "shift_end"),
        (utc("2026-01-05T05:00"), utc("2026-01-05T06:00"), "change"),
    ]


def test_a_back_fill_cuts_the_running_state_up_to_the_end_of_its_data() -> None:
    samples = [Sample(utc("2026-01-05T12:00"), 0, "SETUP", frozenset(), "L1", "S1")]
    assert batch_intervals("d", samples, BERLIN) == []  # its own last report is the end
    closed = batch_intervals("d", samples, BERLIN, horizon=utc("2026-01-05T22:00"))
    assert [(i.start, i.end) for i in closed] == [
        (utc("2026-01-05T12:00"), utc("2026-01-05T13:00")),
        (utc("2026-01-05T13:00"), utc("2026-01-05T21:00")),
    ]


CALENDAR = Shifts.parse("07:00,07:40,08:30", "Europe/Berlin")
"""Shift starts 06:00, 06:40 and 07:30 UTC in January: inside the generated samples' span."""


@settings(max_examples=200, deadline=None)
@given(samples_strategy, st.data())
def test_streaming_with_a_shift_calendar_equals_the_back_fill_to_the_same_horizon(
    steps: list, data: st.DataObject
) -> None:
    samples = build(steps)
    track, streamed, delivered, newest = stream_in_chunks(samples, data, CALENDAR)
    horizon = newest + data.draw(st.integers(1, 3 * 3_600_000))
    closed, _ = track.advance([], horizon)
    streamed.extend(closed)
    expected = batch_intervals("d", delivered, CALENDAR, horizon)
    assert sorted(map(full_key, streamed)) == sorted(map(full_key, expected))
    # Cutting never changes how long a state lasted, only where its rows end: joined again,
    # the pieces are the uncut intervals, plus the running state's pieces up to the horizon.
    joined: list[Interval] = []
    for piece in sorted((i for i in expected if i.kind == "state"), key=lambda i: i.start):
        if joined and joined[-1].closed_by == "shift_end" and joined[-1].end == piece.start:
            assert joined[-1].what == piece.what
            joined[-1] = replace(joined[-1], end=piece.end, closed_by=piece.closed_by)
        else:
            joined.append(piece)
    if joined and joined[-1].closed_by == "shift_end":
        joined.pop()  # the running state, cut up to the horizon
    uncut = [i for i in batch_intervals("d", delivered) if i.kind == "state"]
    assert [(i.what, i.start, i.end) for i in joined] == [(i.what, i.start, i.end) for i in uncut]


def full_key(interval: Interval) -> tuple[object, ...]:
    return (interval.kind, interval.what, interval.start, interval.end, interval.closed_by)
