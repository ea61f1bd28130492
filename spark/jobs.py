"""The factory BI jobs: a streaming job that keeps the tables up to date, and a batch back-fill.

    python -m spark.jobs stream   --nameserver 127.0.0.1:9876 --out bi/ --checkpoint ck/
    python -m spark.jobs backfill --nameserver 127.0.0.1:9876 --out bi/ \
        --from 2026-11-01T00:00 --to 2026-11-08T00:00
    python -m spark.jobs show --out bi/

(`--path DATA_DIR` instead of `--nameserver` reads a bridge's embedded store.) On a Spark
cluster, the same commands go through spark-submit, with the `spark` and `bridge` packages
shipped to the executors (deploy/spark/package.sh makes the zip; docs/spark.md):

    spark-submit --master spark://HOST:7077 --py-files factory-bi.zip spark/jobs.py stream ...

The streaming job runs four queries on the `rocketmq` source, each with its own checkpoint:

* telemetry: every valid message once (deduplicated on device and seq);
* quarantine: every malformed message, with the reason;
* line_minute: per line and minute, appended once the watermark has passed the minute;
* intervals: per device, closed state and alarm intervals (`state_intervals`,
  `alarm_intervals`), and after each micro-batch `availability` and `alarm_summary` are
  recomputed for the days it touched.

The first three write through Spark's exactly-once file sink; the intervals query writes each
micro-batch's rows to `batch=<id>`, replaced if Spark replays the batch after a crash. So a
query stopped or killed at any point and restarted from its checkpoint counts every message
once.
Messages are deduplicated on (device, seq) within the watermark (a QoS 1 retransmission is
stored twice). Rows later than the watermark are dropped by Spark and counted in the query
progress (`numRowsDroppedByWatermark`). Table layouts: docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from spark import tables
from spark.intervals import DeviceTrack, Shifts, days_touched
from spark.options import parse_options
from spark.running import supervise
from spark.source import start_offsets
from spark.telemetry import TOPIC_PREFIX

log = logging.getLogger("spark.jobs")

TELEMETRY_FILTER = f"{TOPIC_PREFIX}/+/+/telemetry"
GOLD_TABLES = ("availability", "alarm_summary")
ALL_TABLES = (
    "telemetry",
    "quarantine",
    "line_minute",
    "state_intervals",
    "alarm_intervals",
    "availability",
    "alarm_summary",
)


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Where to read, where to write, and the knobs both jobs share."""

    out: str
    nameserver: str | None = None
    path: str | None = None
    topic_filter: str = TELEMETRY_FILTER
    shifts: Shifts = field(default_factory=Shifts)
    watermark_s: int = 120
    """How late (device time) a message may arrive and still count."""
    max_clock_ahead_s: int = tables.MAX_CLOCK_AHEAD_S
    """How far ahead of the broker's store time a device's timestamp is believed
    (`tables.parse`); less than the watermark, so one device moves the watermark at most this
    far past the broker's clock and never past an honest device's data."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_clock_ahead_s < self.watermark_s:
            raise ValueError(
                f"the clock allowance ({self.max_clock_ahead_s} s) must be at least 0 and less "
                f"than the watermark ({self.watermark_s} s)"
            )

    def source_options(self, **extra: str) -> dict[str, str]:
        """Options of the `rocketmq` source reading this job's telemetry."""
        options = {"topicFilter": self.topic_filter, **extra}
        if self.nameserver:
            options["nameserver"] = self.nameserver
        if self.path:
            options["path"] = self.path
        return options

    def table(self, name: str) -> str:
        return str(Path(self.out) / name)


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
    good = tables.valid(parsed)
    if start_ms is not None:
        good = good.where(F.col("ts_ms") >= start_ms)
    if end_ms is not None:
        good = good.where(F.col("ts_ms") < end_ms)
    good = good.dropDuplicates(["device", "seq"]).cache()
    intervals = tables.intervals(good).cache()
    states = tables.state_intervals(intervals)
    alarms = tables.alarm_intervals(intervals)
    outputs = {
        "telemetry": good.select(*tables.TELEMETRY_COLUMNS),
        "quarantine": tables.quarantined(parsed),
        "line_minute": tables.line_minute(good),
        "state_intervals": states,
        "alarm_intervals": alarms,
        "availability": tables.availability(states, config.shifts),
        "alarm_summary": tables.alarm_summary(alarms),
    }
    counts = {}
    for name, frame in outputs.items():
        writer = frame.write.mode("overwrite")
        if name in GOLD_TABLES:
            writer = writer.partitionBy(_gold_partition(name))
        writer.parquet(config.table(name))
        # With the frame's schema: an empty table partitioned by date is a folder without a
        # file, from which Spark cannot infer one (all messages malformed, a range with none).
        counts[name] = spark.read.schema(frame.schema).parquet(config.table(name)).count()
    parsed.unpersist()
    return counts


def _gold_partition(name: str) -> str:
    return "shift_date" if name == "availability" else "date"


# --- streaming -----------------------------------------------------------------------------


def _track_devices(
    key: tuple[str], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState: one device's new messages (or a timeout) -> closed intervals."""
    device = key[0]
    track = DeviceTrack.from_json(device, state.get[0]) if state.exists else DeviceTrack(device)
    samples = [] if state.hasTimedOut else [s for f in frames for s in tables.samples_of(f)]
    watermark = state.getCurrentWatermarkMs()
    closed, late = track.advance(samples, watermark)
    if late:
        log.warning(
            "device %s: %d messages older than ones already applied; left out", device, late
        )
    state.update((track.to_json(),))
    due = track.next_due
    if due is not None:
        # Called again once the watermark passes the oldest pending message.
        state.setTimeoutTimestamp(max(due, watermark + 1))
    if closed:  # an empty frame would only be concatenated away
        yield tables.interval_frame(closed)


def _write_batch(frame: DataFrame, path: str, batch_id: int) -> None:
    """A micro-batch's rows into `path/batch=<id>`, replaced if Spark replays the batch."""
    frame.write.mode("overwrite").parquet(f"{path}/batch={batch_id}")


class GoldRefresher:
    """Keeps `availability` and `alarm_summary` up to date for the days new intervals touch,
    recomputing them at most every `every_s` seconds (they read the whole day's intervals, so
    doing it after every micro-batch would slow the stream down).

    Days waiting for a refresh are kept in a file under the intervals checkpoint, written before
    the micro-batch's intervals count as done, so a job killed in between refreshes them after
    its restart."""

    def __init__(self, config: JobConfig, checkpoint: Path, every_s: float) -> None:
        self.config = config
        self.every_s = every_s
        self.path = checkpoint / "gold-pending.json"
        self.pending: set[str] = set()
        if self.path.exists():
            self.pending = set(json.loads(self.path.read_text()))
        self.last = 0.0

    def add(self, days: Iterable[str]) -> None:
        new = set(days) - self.pending
        if new:
            self.pending |= new
            self._save()

    def maybe_refresh(self, spark: SparkSession, *, force: bool = False) -> None:
        if self.pending and (force or time.monotonic() - self.last >= self.every_s):
            refresh_gold(spark, self.config, sorted(self.pending))
            self.pending.clear()
            self._save()
            self.last = time.monotonic()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self.pending)))
        os.replace(tmp, self.path)


def _intervals_batch(config: JobConfig, gold: GoldRefresher):  # type: ignore[no-untyped-def]
    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.cache()
        try:
            states = tables.state_intervals(batch)
            alarms = tables.alarm_intervals(batch)
            _write_batch(states, config.table("state_intervals"), batch_id)
            _write_batch(alarms, config.table("alarm_intervals"), batch_id)
            closed = batch.select("kind", F.unix_millis("start"), F.unix_millis("end")).collect()
            gold.add(days_touched(closed, config.shifts))
            gold.maybe_refresh(batch.sparkSession)
        finally:
            batch.unpersist()

    return write


def refresh_gold(spark: SparkSession, config: JobConfig, days: list[str]) -> None:
    """Recompute `availability` (shift dates) and `alarm_summary` (alarm start dates) for
    `days` from the interval tables, replacing those days' partitions."""
    first = datetime.fromisoformat(min(days)).replace(tzinfo=UTC)
    # A shift of day d lies within [d 00:00, d+2 00:00): its start is a time of day d, and it
    # ends at the latest at the first shift start of d+1.
    last = datetime.fromisoformat(max(days)).replace(tzinfo=UTC) + timedelta(days=2)
    states = spark.read.parquet(config.table("state_intervals")).drop("batch")
    overlapping = states.where((F.col("end") > F.lit(first)) & (F.col("start") < F.lit(last)))
    table = tables.availability(overlapping, config.shifts).where(F.col("shift_date").isin(days))
    _overwrite_partitions(table, config.table("availability"), "shift_date")
    alarms = spark.read.parquet(config.table("alarm_intervals")).drop("batch")
    summary = tables.alarm_summary(alarms.where(F.to_date("start").cast("string").isin(days)))
    _overwrite_partitions(summary, config.table("alarm_summary"), "date")


def _overwrite_partitions(frame: DataFrame, path: str, column: str) -> None:
    spark = frame.sparkSession
    previous = spark.conf.get("spark.sql.sources.partitionOverwriteMode")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        frame.write.mode("overwrite").partitionBy(column).parquet(path)
    finally:
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", previous or "static")


def stream_starters(
    spark: SparkSession,
    config: JobConfig,
    checkpoint: str,
    *,
    trigger_s: float = 5.0,
    available_now: bool = False,
    max_per_trigger: int | None = None,
    starting_offsets: str = "earliest",
    gold: GoldRefresher | None = None,
) -> dict[str, Callable[[], StreamingQuery]]:
    """The four queries, by name, each as a function that starts it; a query resumes from its
    checkpoint under `checkpoint`, so starting one again after it failed is exactly-once. A new
    query starts at `starting_offsets`, resolved once here so that all four start at the same
    offsets (each would otherwise resolve "latest" at its own first trigger)."""
    options = config.source_options()
    start = start_offsets(
        parse_options({**options, "startingOffsets": starting_offsets}, streaming=True)
    )
    options["startingOffsets"] = json.dumps(start)
    if max_per_trigger:
        options["maxMessagesPerTrigger"] = str(max_per_trigger)

    def parsed() -> DataFrame:
        raw = spark.readStream.format("rocketmq").options(**options).load()
        return tables.parse(raw, config.max_clock_ahead_s)

    def deduplicated() -> DataFrame:
        watermark = f"{config.watermark_s} seconds"
        rows = tables.valid(parsed()).withWatermark("ts", watermark)
        return rows.dropDuplicatesWithinWatermark(["device", "seq"])

    def trigger(writer):  # type: ignore[no-untyped-def]
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{trigger_s} seconds")

    ck = Path(checkpoint)

    def to_files(frame: Callable[[], DataFrame], name: str) -> Callable[[], StreamingQuery]:
        def start() -> StreamingQuery:
            # Spark's file sink: a micro-batch's files count only once its commit is logged.
            writer = (
                frame()
                .writeStream.format("parquet")
                .outputMode("append")
                .option("path", config.table(name))
                .option("checkpointLocation", str(ck / name))
            )
            return trigger(writer).queryName(name).start()

        return start

    if gold is None:
        gold = GoldRefresher(config, ck / "intervals", 0.0 if available_now else 60.0)
    batch_writer = _intervals_batch(config, gold)

    def intervals() -> StreamingQuery:
        columns = ["device", "line", "station", "seq", "ts", "ts_ms", "state", "alarms"]
        stateful = (
            deduplicated()
            .select(*columns)
            .groupBy("device")
            .applyInPandasWithState(
                _track_devices,
                tables.INTERVAL_DDL,
                "track STRING",
                "append",
                GroupStateTimeout.EventTimeTimeout,
            )
        )
        writer = stateful.writeStream.foreachBatch(batch_writer)
        return (
            trigger(writer.option("checkpointLocation", str(ck / "intervals")))
            .queryName("intervals")
            .start()
        )

    return {
        "telemetry": to_files(
            # Rows whose device clock was not believed, per micro-batch, in the query's
            # progress (`observedMetrics`).
            lambda: (
                deduplicated()
                .select(*tables.TELEMETRY_COLUMNS)
                .observe("clock", F.count_if(F.col("clock_ahead")).alias("clock_ahead_rows"))
            ),
            "telemetry",
        ),
        "quarantine": to_files(lambda: tables.quarantined(parsed()), "quarantine"),
        "line_minute": to_files(lambda: tables.line_minute(deduplicated()), "line_minute"),
        "intervals": intervals,
    }


# --- reading the tables ---------------------------------------------------------------------


def read_table(spark: SparkSession, config: JobConfig, name: str) -> DataFrame | None:
    """A table as the jobs left it (without the micro-batch column), or None if not written."""
    path = Path(config.table(name))
    if not path.exists() or not any(path.rglob("*.parquet")):
        return None
    frame = spark.read.parquet(str(path))
    return frame.drop("batch") if "batch" in frame.columns else frame


def show_tables(spark: SparkSession, config: JobConfig, rows: int = 20) -> None:
    order = {
        "telemetry": ["device", "seq"],
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


def _shifts(text: str) -> Shifts:
    try:
        return Shifts.parse(text)
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
                type=_shifts,
                default=Shifts(),
                help="shift start times, UTC (default 06:00,14:00,22:00)",
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
        config = JobConfig(
            out=args.out,
            nameserver=args.nameserver,
            path=args.path,
            topic_filter=args.topic_filter,
            shifts=args.shifts,
            watermark_s=args.watermark,
            max_clock_ahead_s=args.max_clock_ahead,
        )
    except ValueError as exc:
        parser.error(str(exc))
    spark = spark_session(f"factory-bi-{args.command}")
    if args.command == "backfill":
        counts = run_backfill(spark, config, args.start, args.end)
        for name, count in counts.items():
            print(f"{name}: {count} rows")
        return 0
    return run_streams(spark, config, args)


def run_streams(spark: SparkSession, config: JobConfig, args: argparse.Namespace) -> int:
    """Run the streaming queries until SIGINT/SIGTERM (or `--for`, or all data with
    `--available-now`). A query that fails (a broker restart, or Spark's Python worker not
    connecting back in time on a loaded machine) is restarted from its checkpoint, which is
    exactly-once, after the wait `RestartPolicy` gives, while the others run on; the job gives
    up when failures come too often (`spark/running.py`)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Stop between micro-batches rather than interrupt a call into the JVM.
        signal.signal(signum, lambda *_: stop.set())
    gold = GoldRefresher(
        config, Path(args.checkpoint) / "intervals", 0.0 if args.available_now else 60.0
    )

    def finish() -> None:
        try:
            gold.maybe_refresh(spark, force=True)
        except Exception:
            if not stop.is_set():
                raise
            log.info("stopping: availability left for the next run (days kept in %s)",
                     gold.path)  # fmt: skip

    return supervise(
        stream_starters(
            spark,
            config,
            args.checkpoint,
            trigger_s=args.trigger,
            available_now=args.available_now,
            max_per_trigger=args.max_per_trigger,
            starting_offsets=args.starting_offsets,
            gold=gold,
        ),
        finish,
        available_now=args.available_now,
        deadline=None if args.run_for is None else time.monotonic() + args.run_for,
        stop=stop,
    )


if __name__ == "__main__":
    if not __package__:
        # Run as a file (`spark-submit spark/jobs.py`): run the package's module instead, so
        # that the functions Spark ships to executors name `spark.jobs`, which the executors
        # import from --py-files, not a `__main__` they do not have.
        from spark.jobs import main as package_main

        sys.exit(package_main())
    sys.exit(main())
