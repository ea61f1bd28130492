"""The factory BI jobs: a streaming job that keeps the tables up to date, and a batch back-fill.

    python -m spark.jobs stream   --nameserver 127.0.0.1:9876 --out bi/ --checkpoint ck/
    python -m spark.jobs backfill --nameserver 127.0.0.1:9876 --out bi/ \
        --from 2026-11-01T00:00 --to 2026-11-08T00:00
    python -m spark.jobs show --out bi/

(`--path DATA_DIR` instead of `--nameserver` reads a bridge's embedded store.) On a Spark
cluster, the same commands go through spark-submit, with the `spark` and `bridge` packages
shipped to the executors (deploy/spark/package.sh makes the zip; docs/spark.md):

    spark-submit --master spark://HOST:7077 --py-files factory-bi.zip spark/jobs.py stream ...

The back-fill, reading the tables and the command line are here; the streaming job is
`spark.stream`'s, what both share (`JobConfig`, the tables' names) `spark.job_config`'s. Table
layouts: docs/spark.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import delta, tables
from spark.delta import TableState
from spark.job_config import ALL_TABLES, LAYOUTS, TELEMETRY_FILTER, JobConfig, dated
from spark.presence import DeviceClientIds
from spark.shifts import Downtime, Shifts
from spark.stream import run_streams

log = logging.getLogger("spark.jobs")

# --- batch ---------------------------------------------------------------------------------


def run_backfill(
    spark: SparkSession, config: JobConfig, start_ms: int | None, end_ms: int | None
) -> dict[str, int]:
    """Rebuild every table from the messages of devices' time [start_ms, end_ms) (all when
    None), replacing what the tables held. Returns the row count of each table."""
    options = config.source_options()
    if start_ms is not None:
        # Stored no earlier than the device time it reports, less the watermark of clock skew.
        options["startingTimestamp"] = str(max(0, start_ms - config.watermark_s * 1000))
    raw = spark.read.format("rocketmq").options(**options).load()
    parsed = tables.parse(raw, config.max_clock_ahead_s).cache()
    good = _once_in_range(tables.valid(parsed), start_ms, end_ms).cache()
    # States run on to the newest report of any device: as far as a stream's watermark would
    # have let it cut them at shift starts.
    horizon = good.agg(F.max("ts_ms")).first()[0] or 0
    intervals = tables.intervals(
        good.unionByName(_disconnects(spark, config, start_ms, end_ms)), config.shifts, horizon
    ).cache()
    states = tables.state_intervals(intervals)
    alarms = tables.alarm_intervals(intervals)
    outputs = {
        "telemetry": good.select(*tables.TELEMETRY_COLUMNS),
        # Nothing is late for a back-fill, which reads everything before it counts.
        "late": good.select(
            *tables.TELEMETRY_COLUMNS, F.lit(None).cast("timestamp").alias("watermark")
        ).limit(0),
        "quarantine": tables.quarantined(parsed),
        "line_minute": tables.line_minute(good),
        "state_intervals": states,
        "alarm_intervals": alarms,
        "availability": tables.availability(states, config.shifts),
        "alarm_summary": tables.alarm_summary(alarms, config.shifts),
    }
    counts = {}
    for name, frame in outputs.items():
        # Each table replaced in one Delta version: a reader sees the old table or the new one.
        path = config.table(name)
        delta.replace_table(dated(frame, name, config.shifts), path, LAYOUTS[name].partition)
        table = delta.read(spark, path)
        assert table is not None
        counts[name] = table.count()
    parsed.unpersist()
    return counts


def _disconnects(
    spark: SparkSession, config: JobConfig, start_ms: int | None, end_ms: int | None
) -> DataFrame:
    """The devices' disconnects in [start_ms, end_ms) as OFFLINE rows (`spark.presence`), in
    the valid rows' columns; none when devices' ClientIds are not known."""
    options = config.presence_options()
    if options is None:
        return spark.createDataFrame([], tables.PARSED_DDL)
    if start_ms is not None:
        options["startingTimestamp"] = str(start_ms)
    raw = spark.read.format("rocketmq").options(**options).load()
    rows = tables.valid(tables.parse(raw, config.max_clock_ahead_s, config.device_client_ids))
    return _once_in_range(rows, start_ms, end_ms)


def _once_in_range(rows: DataFrame, start_ms: int | None, end_ms: int | None) -> DataFrame:
    """The valid rows of event time [start_ms, end_ms) (open ends when None), each (device,
    seq) once: a QoS 1 retransmission is stored twice."""
    if start_ms is not None:
        rows = rows.where(F.col("ts_ms") >= start_ms)
    if end_ms is not None:
        rows = rows.where(F.col("ts_ms") < end_ms)
    return rows.dropDuplicates(["device", "seq"])


# --- reading the tables ---------------------------------------------------------------------


def read_table(spark: SparkSession, config: JobConfig, name: str) -> DataFrame | None:
    """A table's newest version, or None if it was never written."""
    return delta.read(spark, config.table(name))


def table_states(spark: SparkSession, config: JobConfig) -> list[TableState]:
    """Where each written table stands (`spark.delta.table_state`)."""
    states = []
    for name in ALL_TABLES:
        state = delta.table_state(spark, name, config.table(name), LAYOUTS[name].newest)
        if state is not None:
            states.append(state)
    return states


def show_tables(spark: SparkSession, config: JobConfig, rows: int = 20) -> None:
    """Where each table stands, then each table's first `rows` rows."""
    print(f"{'table':<16} {'version':>7}  {'committed (UTC)':<19}  {'files':>5}  newest")
    for state in table_states(spark, config):
        committed = state.committed.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{state.name:<16} {state.version:>7}  {committed:<19}  {state.files:>5}  "
              f"{state.newest or '(empty)'}")  # fmt: skip
    order = {
        "telemetry": ["device", "seq"],
        "late": ["device", "ts"],
        "quarantine": ["store_time"],
        "line_minute": ["minute", "line"],
        "state_intervals": ["device", "start"],
        "alarm_intervals": ["device", "start"],
        "availability": ["shift_date", "shift", "device"],
        "alarm_summary": ["date", "code"],
    }
    for name in ALL_TABLES:
        frame = read_table(spark, config, name)
        if frame is None:
            print(f"\n== {name}: (no rows yet)")
            continue
        print(f"\n== {name}: {frame.count()} rows")
        if name == "quarantine":
            frame = frame.withColumn("payload", F.substring(F.col("payload").cast("string"), 1, 40))
        frame.orderBy(*order[name]).show(rows, truncate=False)


# --- command line --------------------------------------------------------------------------


def _time(text: str) -> int:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected an ISO time like 2026-11-01T06:00"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def _shift_starts(text: str) -> tuple[int, ...]:
    try:
        return Shifts.parse(text).starts_minutes
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _client_ids(text: str) -> DeviceClientIds:
    try:
        return DeviceClientIds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _downtime(text: str) -> Downtime:
    try:
        return Downtime.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark.jobs", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, source: bool = True) -> None:
        p.add_argument("--out", required=True, help="directory of the tables")
        if source:
            where = p.add_mutually_exclusive_group(required=True)
            where.add_argument("--nameserver", help="RocketMQ NameServer host:port")
            where.add_argument("--path", help="data directory of a bridge on the embedded store")
            p.add_argument("--topic-filter", default=TELEMETRY_FILTER)
            p.add_argument(
                "--shifts",
                type=_shift_starts,
                default=Shifts().starts_minutes,
                help="shift start times, the plant's wall-clock (default 06:00,14:00,22:00)",
            )
            p.add_argument(
                "--timezone",
                default="UTC",
                help="the plant's IANA time zone, e.g. Europe/Berlin: shifts and days follow its "
                "clocks, daylight saving included (default UTC)",
            )
            p.add_argument(
                "--planned-downtime",
                type=_downtime,
                action="append",
                default=[],
                metavar="[DAYS|DATE] HH:MM-HH:MM",
                help="planned downtime, local time, left out of availability: '12:00-12:30' "
                "every day, 'Sat,Sun 00:00-24:00', '2026-12-24 14:00-24:00' (repeatable)",
            )
            p.add_argument(
                "--device-client-id",
                type=_client_ids,
                default=None,
                metavar="PATTERN",
                help="devices connect with this ClientId, {device} standing for the device id "
                "(e.g. {device}, sim-{device}): their disconnects (the broker's $SYS events) "
                "make them OFFLINE until their next report (default: not read)",
            )
            p.add_argument(
                "--watermark",
                type=int,
                default=120,
                metavar="SECONDS",
                help="how late a message may arrive, device time (default 120)",
            )
            p.add_argument(
                "--max-clock-ahead",
                type=int,
                default=tables.MAX_CLOCK_AHEAD_S,
                metavar="SECONDS",
                help="a device timestamp further ahead of the broker's store time counts at "
                f"the store time, flagged (default {tables.MAX_CLOCK_AHEAD_S})",
            )

    stream = sub.add_parser("stream", help="keep the tables up to date")
    common(stream)
    stream.add_argument("--checkpoint", required=True)
    stream.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS")
    stream.add_argument("--max-per-trigger", type=int, default=None)
    stream.add_argument("--starting-offsets", default="earliest")
    stream.add_argument(
        "--available-now", action="store_true", help="process what is stored now, then stop"
    )
    stream.add_argument(
        "--for",
        dest="run_for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long (default: run until interrupted)",
    )
    backfill = sub.add_parser("backfill", help="rebuild the tables from a time range")
    common(backfill)
    backfill.add_argument("--from", dest="start", type=_time, default=None)
    backfill.add_argument("--to", dest="end", type=_time, default=None)
    show = sub.add_parser("show", help="print the tables")
    common(show, source=False)
    show.add_argument("--rows", type=int, default=20)
    return parser


def job_config(args: argparse.Namespace) -> JobConfig:
    """The `JobConfig` of a `backfill` or `stream` command line (ValueError when it cannot be)."""
    return JobConfig(
        out=args.out,
        nameserver=args.nameserver,
        path=args.path,
        topic_filter=args.topic_filter,
        shifts=Shifts(args.shifts, args.timezone, tuple(args.planned_downtime)),
        watermark_s=args.watermark,
        max_clock_ahead_s=args.max_clock_ahead,
        device_client_ids=args.device_client_id,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from spark.session import spark_session

    if args.command == "show":
        spark = spark_session("factory-bi-show")
        show_tables(spark, JobConfig(out=args.out), args.rows)
        return 0
    try:
        config = job_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    spark = spark_session(f"factory-bi-{args.command}")
    if args.command == "backfill":
        began = time.monotonic()
        counts = run_backfill(spark, config, args.start, args.end)
        for name, count in counts.items():
            print(f"{name}: {count} rows")
        print(f"back-fill took {time.monotonic() - began:.1f} s")
        return 0
    return run_streams(spark, config, args)


if __name__ == "__main__":
    if not __package__:
        # Run as a file (`spark-submit spark/jobs.py`): run the package's module instead, so
        # that the functions Spark ships to executors name `spark.jobs`, which the executors
        # import from --py-files, not a `__main__` they do not have.
        from spark.jobs import main as package_main

        sys.exit(package_main())
    sys.exit(main())
