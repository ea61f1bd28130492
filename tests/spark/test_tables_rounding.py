"""The BI tables show durations to the millisecond and ratios to four places: sums of float
seconds (0.1 + 0.2 = 0.30000000000000004) never reach a reader as float noise."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from hypothesis import example, given
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from spark import tables
from spark.intervals import Interval
from spark.shifts import Shifts

DAY = dt.datetime(2026, 3, 2, 7, 0, 0)  # inside shift 1 (06:00-14:00 UTC)


def _at(ms: int) -> dt.datetime:
    return DAY + dt.timedelta(milliseconds=ms)


def test_availability_and_alarm_summary_round_float_sums_to_the_millisecond(
    spark: SparkSession,
) -> None:
    # Three state pieces of 0.1 s, 0.2 s and 0.7 s: float sums give 0.30000000000000004 s
    # running and an availability of 0.30000000000000004.
    states = spark.createDataFrame(
        [
            ("d1", "L1", "S1", "RUNNING", _at(0), _at(100), 0.1),
            ("d1", "L1", "S1", "RUNNING", _at(100), _at(300), 0.2),
            ("d1", "L1", "S1", "IDLE", _at(300), _at(1000), 0.7),
        ],
        "device STRING, line STRING, station STRING, state STRING, start TIMESTAMP, "
        "`end` TIMESTAMP, duration_s DOUBLE",
    )
    row = tables.availability(states, Shifts()).collect()[0]
    assert (row.running_s, row.idle_s, row.observed_s) == (0.3, 0.7, 1.0)
    assert row.availability == 0.3
    alarms = spark.createDataFrame(
        [
            ("d1", "L1", "S1", "E7", _at(0), _at(100), 0.1),
            ("d2", "L1", "S2", "E7", _at(0), _at(200), 0.2),
        ],
        "device STRING, line STRING, station STRING, code STRING, start TIMESTAMP, "
        "`end` TIMESTAMP, duration_s DOUBLE",
    )
    summary = tables.alarm_summary(alarms, Shifts()).collect()[0]
    assert (summary["count"], summary.total_s, summary.max_s, summary.devices) == (2, 0.3, 0.2, 2)


def test_scrap_rate_is_a_ratio_to_four_places_and_null_without_parts(spark: SparkSession) -> None:
    valid = spark.createDataFrame(
        [
            ("L1", _at(0), 2, 1),
            ("L2", _at(0), 0, 0),
        ],
        "line STRING, ts TIMESTAMP, good BIGINT, bad BIGINT",
    )
    rates = {r.line: r.scrap_rate for r in tables.line_minute(valid).collect()}
    assert rates == {"L1": 0.3333, "L2": None}


@example(start=1_700_000_000_123, duration=1_199_999)
@given(
    start=st.integers(0, 4_102_444_800_000),  # 1970 to 2100 in epoch milliseconds
    duration=st.integers(0, 10 * 365 * 86_400_000),
)
def test_interval_durations_are_whole_milliseconds_in_seconds(start: int, duration: int) -> None:
    closed = [Interval("state", "d1", "L1", "S1", "RUNNING", start, start + duration)]
    (seconds,) = tables.interval_frame(closed)["duration_s"].tolist()
    # What a reader sees (the shortest text of the float) is the whole milliseconds, never
    # noise: 1199.999, not 1199.9990000724792 as seconds subtracted from seconds would give.
    assert Decimal(repr(seconds)) == Decimal(duration) / 1000
