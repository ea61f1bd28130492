"""The factory BI tables as DataFrame transformations, shared by the batch and streaming jobs.

    parse(raw)            source rows -> one row per message: telemetry fields or an error
    line_minute(valid)    per line and minute: good, bad, total, scrap rate, messages
    intervals(valid)      closed state and alarm intervals per device (batch form)
    availability(states)  per device and shift: seconds in each state, availability
    alarm_summary(alarms) per plant day and alarm code: count, total and longest duration,
                          devices

Table layouts are in docs/spark.md. Units are in the column names (`_s`: seconds); durations are
rounded to the millisecond the devices stamp (`SECONDS_DIGITS`) and ratios to `RATIO_DIGITS`
places, so a table never shows float noise such as 1199.9999999999998.

Payloads are checked by `spark.telemetry.validate`, the same rules the simulator's tests and
docs/telemetry.md use; a payload it refuses becomes a quarantine row carrying the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.intervals import Interval, Sample, batch_intervals
from spark.presence import OFFLINE, DeviceClientIds, disconnect_of
from spark.shifts import Shifts
from spark.telemetry import validate

PARSED_DDL = (
    "device STRING, line STRING, station STRING, seq BIGINT, ts TIMESTAMP, ts_ms BIGINT, "
    "device_ts TIMESTAMP, clock_ahead BOOLEAN, "
    "state STRING, good BIGINT, bad BIGINT, alarms ARRAY<STRING>, error STRING, "
    "topic STRING, payload BINARY, key STRING, publish_time TIMESTAMP, store_time TIMESTAMP, "
    "broker STRING, queue INT, offset BIGINT"
)
TELEMETRY_COLUMNS = [
    "device", "line", "station", "seq", "ts", "device_ts", "clock_ahead", "state", "good", "bad",
    "alarms", "topic", "key", "store_time",
]  # fmt: skip
LATE_COLUMNS = [*TELEMETRY_COLUMNS, "watermark"]
"""A late row: the telemetry columns and the event-time watermark it came behind."""
ARRIVALS_DDL = (
    "arrival STRING, device STRING, line STRING, station STRING, seq BIGINT, ts TIMESTAMP, "
    "device_ts TIMESTAMP, clock_ahead BOOLEAN, state STRING, good BIGINT, bad BIGINT, "
    "alarms ARRAY<STRING>, topic STRING, key STRING, store_time TIMESTAMP, watermark TIMESTAMP, "
    "error STRING, payload BINARY, publish_time TIMESTAMP, broker STRING, queue INT, offset BIGINT"
)
"""The stream's sorted rows (`spark.arrivals`): `arrival` is "counted", "late" or "quarantine"
(a malformed message: `error` says why; `payload` is kept for those rows only)."""
ARRIVALS_COLUMNS = [
    "arrival", *LATE_COLUMNS, "error", "payload", "publish_time", "broker", "queue", "offset",
]  # fmt: skip
"""ARRIVALS_DDL's columns, in order."""
QUARANTINE_COLUMNS = [
    "error", "topic", "payload", "key", "publish_time", "store_time", "broker", "queue", "offset",
]  # fmt: skip
INTERVAL_DDL = (
    "kind STRING, device STRING, line STRING, station STRING, what STRING, "
    "start TIMESTAMP, `end` TIMESTAMP, duration_s DOUBLE, closed_by STRING"
)

SECONDS_DIGITS = 3
"""Durations in seconds keep millisecond precision: the device clock's (`ts` is in ms)."""
RATIO_DIGITS = 4
"""Ratios (scrap rate, availability) keep 4 places: 0.01 percentage point."""

_PASSED = ("topic", "payload", "key", "publish_time", "store_time", "broker", "queue", "offset")
_FROM_PAYLOAD = {
    "device": "device", "line": "line", "station": "station", "seq": "seq", "ts_ms": "ts",
    "state": "state", "good": "good", "bad": "bad", "alarms": "alarms",
}  # fmt: skip
"""Column -> field of the validated payload."""


MAX_CLOCK_AHEAD_S = 30
"""How far ahead of the broker's clock a device's timestamp is believed, by default."""


NOT_A_DEVICE_EVENT = "not a disconnect event of a device"
"""The error of a `$SYS` message that says nothing about a device (`spark.presence`)."""


def _checked(
    topic: str, payload: bytes, ids: DeviceClientIds | None
) -> tuple[dict | None, str | None]:
    """(the row's fields, None) or (None, why not): a telemetry payload, or with `ids` a
    device's disconnect event as an OFFLINE row (seq = -time, so that a copy of the event
    deduplicates and no device's own seq is taken)."""
    if ids is None or not topic.startswith("$SYS/"):
        return validate(payload)
    event = disconnect_of(topic, payload, ids)
    if event is None:
        return None, NOT_A_DEVICE_EVENT
    device, ts = event
    return {"device": device, "line": None, "station": None, "seq": -ts, "ts": ts,
            "state": OFFLINE, "good": 0, "bad": 0, "alarms": []}, None  # fmt: skip


def _parse_batches(
    batches: Iterator[pa.RecordBatch], max_ahead_ms: int, ids: DeviceClientIds | None
) -> Iterator[pa.RecordBatch]:
    schema = _parsed_arrow_schema()
    for batch in batches:
        checked = [
            _checked(topic or "", payload or b"", ids)
            for topic, payload in zip(
                batch.column("topic").to_pylist(), batch.column("payload").to_pylist(), strict=True
            )
        ]
        arrays = {
            name: pa.array(
                [record[field] if record else None for record, _ in checked],
                type=schema.field(name).type,
            )
            for name, field in _FROM_PAYLOAD.items()
        }
        device_ms = arrays["ts_ms"]
        stored = batch.column("store_time").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
        ahead = pc.greater(device_ms, pc.add(stored, max_ahead_ms))
        ahead = pc.if_else(pc.is_null(device_ms), ahead, pc.fill_null(ahead, False))
        arrays["ts_ms"] = pc.if_else(ahead, stored, device_ms)
        arrays["clock_ahead"] = ahead
        arrays["ts"] = pc.multiply(arrays["ts_ms"], 1000).cast(schema.field("ts").type)
        arrays["device_ts"] = pc.multiply(device_ms, 1000).cast(schema.field("ts").type)
        arrays["error"] = pa.array([reason for _, reason in checked], type=pa.string())
        for name in _PASSED:  # handed through as they came, no Python objects
            arrays[name] = batch.column(name).cast(schema.field(name).type)
        yield pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema)


def _parsed_arrow_schema() -> pa.Schema:
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("device", pa.string()),
            ("line", pa.string()),
            ("station", pa.string()),
            ("seq", pa.int64()),
            ("ts", ts),
            ("ts_ms", pa.int64()),
            ("device_ts", ts),
            ("clock_ahead", pa.bool_()),
            ("state", pa.string()),
            ("good", pa.int64()),
            ("bad", pa.int64()),
            ("alarms", pa.list_(pa.string())),
            ("error", pa.string()),
            ("topic", pa.string()),
            ("payload", pa.binary()),
            ("key", pa.string()),
            ("publish_time", ts),
            ("store_time", ts),
            ("broker", pa.string()),
            ("queue", pa.int32()),
            ("offset", pa.int64()),
        ]
    )


def parse(
    raw: DataFrame,
    max_clock_ahead_s: float = MAX_CLOCK_AHEAD_S,
    client_ids: DeviceClientIds | None = None,
) -> DataFrame:
    """Source rows -> PARSED_DDL rows: telemetry fields (error null) or an error (fields null).
    With `client_ids`, a stored disconnect event of a device is a row of state OFFLINE at the
    broker's time of the event, without line and station (`spark.presence`).

    A row's event time (`ts`, `ts_ms`) is the device's timestamp unless that lies more than
    `max_clock_ahead_s` ahead of the time the broker stored the message: a clock that far
    ahead is wrong, and believing it would move the stream's watermark past every other
    device's data. Such a row counts at its store time instead, keeps the device's time in
    `device_ts` and is flagged `clock_ahead`. A timestamp in the past is believed (a device
    sends what it buffered during an outage): it is late, not wrong."""
    max_ahead_ms = int(max_clock_ahead_s * 1000)

    def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _parse_batches(batches, max_ahead_ms, client_ids)

    return raw.select(*_PASSED).mapInArrow(parse_batches, PARSED_DDL)


def valid(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("error").isNull())


def quarantined(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("error").isNotNull()).select(*QUARANTINE_COLUMNS)


def line_minute(valid_rows: DataFrame) -> DataFrame:
    """Good and bad parts per line and minute of device time; scrap rate = bad / (good + bad)
    (null in a minute without parts). Works on a stream with a watermark on `ts`."""
    grouped = valid_rows.groupBy(F.window("ts", "1 minute"), "line").agg(
        F.sum("good").alias("good"),
        F.sum("bad").alias("bad"),
        F.count(F.lit(1)).alias("messages"),
    )
    total = F.col("good") + F.col("bad")
    return grouped.select(
        "line",
        F.col("window.start").alias("minute"),
        "good",
        "bad",
        total.alias("total"),
        F.when(total > 0, F.round(F.col("bad") / total, RATIO_DIGITS)).alias("scrap_rate"),
        "messages",
    )


def samples_of(frame: pd.DataFrame) -> list[Sample]:
    """The interval builder's samples from a pandas frame of valid rows."""
    return [
        Sample(int(ts), int(seq), str(state), frozenset(alarms), line or "", station or "")
        for ts, seq, state, alarms, line, station in zip(
            frame["ts_ms"],
            frame["seq"],
            frame["state"],
            frame["alarms"],
            frame["line"],
            frame["station"],
            strict=True,
        )
    ]


def samples_by_device(frame: pd.DataFrame) -> dict[str, list[Sample]]:
    """`samples_of` a frame of several devices' rows, per device, each in the frame's order."""
    samples: dict[str, list[Sample]] = {}
    for device, sample in zip(frame["device"], samples_of(frame), strict=True):
        samples.setdefault(device, []).append(sample)
    return samples


def interval_frame(closed: list[Interval]) -> pd.DataFrame:
    """Intervals as a pandas frame of INTERVAL_DDL."""

    def text(values: list[str]) -> pd.Series:
        return pd.Series(values, dtype=object)  # an empty list would become float64

    return pd.DataFrame(
        {
            "kind": text([i.kind for i in closed]),
            "device": text([i.device for i in closed]),
            "line": text([i.line for i in closed]),
            "station": text([i.station for i in closed]),
            "what": text([i.what for i in closed]),
            "start": pd.to_datetime(pd.Series([i.start for i in closed], dtype="int64"), unit="ms"),
            "end": pd.to_datetime(pd.Series([i.end for i in closed], dtype="int64"), unit="ms"),
            # Whole milliseconds divided by 1000 is already the float nearest the decimal
            # seconds (division rounds correctly): no noise to round away, unlike a sum.
            "duration_s": pd.Series([(i.end - i.start) / 1000 for i in closed], dtype="float64"),
            "closed_by": text([i.closed_by for i in closed]),
        }
    )


def _batch_devices(shifts: Shifts, horizon: int):  # type: ignore[no-untyped-def]
    def batch_device(key: tuple[str], frame: pd.DataFrame) -> pd.DataFrame:
        return interval_frame(batch_intervals(key[0], samples_of(frame), shifts, horizon))

    return batch_device


def intervals(valid_rows: DataFrame, shifts: Shifts, horizon: int) -> DataFrame:
    """Every closed state and alarm interval of the given (deduplicated) messages, states cut
    at the shift starts before `horizon` (the back-fill's end of data: its newest `ts_ms`)."""
    columns = ["device", "line", "station", "seq", "ts_ms", "state", "alarms"]
    return (
        valid_rows.select(*columns)
        .groupBy("device")
        .applyInPandas(_batch_devices(shifts, horizon), INTERVAL_DDL)
    )


def state_intervals(all_intervals: DataFrame) -> DataFrame:
    return all_intervals.where(F.col("kind") == "state").select(
        "device", "line", "station", F.col("what").alias("state"), "start", "end", "duration_s",
        "closed_by",
    )  # fmt: skip


def alarm_intervals(all_intervals: DataFrame) -> DataFrame:
    return all_intervals.where(F.col("kind") == "alarm").select(
        "device", "line", "station", F.col("what").alias("code"), "start", "end", "duration_s",
        "closed_by",
    )  # fmt: skip


_PIECES_DDL = (
    "device STRING, line STRING, shift_date STRING, shift INT, shift_start TIMESTAMP, "
    "planned DOUBLE, state STRING, seconds DOUBLE"
)


def _shift_pieces(shifts: Shifts):  # type: ignore[no-untyped-def]
    def split(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows = []
            starts = frame["start"].astype("datetime64[ms]").astype("int64")
            ends = frame["end"].astype("datetime64[ms]").astype("int64")
            for device, line, state, start, end in zip(
                frame["device"], frame["line"], frame["state"], starts, ends, strict=True
            ):
                for piece in shifts.pieces(int(start), int(end)):
                    rows.append((device, line, piece.shift_date, piece.shift, piece.shift_start,
                                 piece.planned_ms / 1000, state, piece.ms / 1000))  # fmt: skip
            columns = list(zip(*rows, strict=True)) if rows else [()] * 8
            out = pd.DataFrame(
                {
                    "device": pd.Series(columns[0], dtype=object),
                    "line": pd.Series(columns[1], dtype=object),
                    "shift_date": pd.Series(columns[2], dtype=object),
                    "shift": pd.Series(columns[3], dtype="int32"),
                    "shift_start": pd.to_datetime(pd.Series(columns[4], dtype="int64"), unit="ms"),
                    "planned": pd.Series(columns[5], dtype="float64"),
                    "state": pd.Series(columns[6], dtype=object),
                    "seconds": pd.Series(columns[7], dtype="float64"),
                }
            )
            yield out

    return split


def availability(states: DataFrame, shifts: Shifts) -> DataFrame:
    """Per device and shift of the calendar: the shift's planned production time (`planned_s`:
    its length less planned downtime), the seconds RUNNING, IDLE, DOWN, SETUP and OFFLINE
    within closed state intervals outside planned downtime, observed = their sum, and the OEE
    availability running / observed (docs/spark.md: the time before a device's first report is
    not held against it)."""
    pieces = states.select("device", "line", "state", "start", "end").mapInPandas(
        _shift_pieces(shifts), _PIECES_DDL
    )

    def seconds_in(state: str) -> F.Column:
        return F.sum(F.when(F.col("state") == state, F.col("seconds")).otherwise(0.0))

    table = pieces.groupBy("device", "line", "shift_date", "shift", "shift_start", "planned").agg(
        seconds_in("RUNNING").alias("running"),
        seconds_in("IDLE").alias("idle"),
        seconds_in("DOWN").alias("down"),
        seconds_in("SETUP").alias("setup"),
        seconds_in(OFFLINE).alias("offline"),
        F.sum("seconds").alias("observed"),
    )
    return table.select(
        "device",
        "line",
        "shift_date",
        "shift",
        "shift_start",
        *(
            _seconds(name)
            for name in ("planned", "running", "idle", "down", "setup", "offline", "observed")
        ),
        F.round(F.col("running") / F.col("observed"), RATIO_DIGITS).alias("availability"),
    )


def _seconds(name: str) -> F.Column:
    """Column `name` (a sum of seconds) rounded to the millisecond, as `<name>_s`."""
    return F.round(F.col(name), SECONDS_DIGITS).alias(f"{name}_s")


def plant_date(column: str, shifts: Shifts) -> F.Column:
    """The plant's local date (ISO) of timestamp `column` (the session's time zone is UTC)."""
    return F.to_date(F.from_utc_timestamp(column, shifts.timezone)).cast("string")


def alarm_summary(alarms: DataFrame, shifts: Shifts) -> DataFrame:
    """Per day (the plant's local date of the alarm's start) and code: how many, total and
    longest seconds, and how many devices raised it."""
    return alarms.groupBy(plant_date("start", shifts).alias("date"), "code").agg(
        F.count(F.lit(1)).alias("count"),
        F.round(F.sum("duration_s"), SECONDS_DIGITS).alias("total_s"),
        F.round(F.max("duration_s"), SECONDS_DIGITS).alias("max_s"),
        F.countDistinct("device").alias("devices"),
    )
