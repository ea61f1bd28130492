"""The streaming BI job: three queries that keep the tables up to date.

Each query has its own checkpoint. One reads the broker (`rocketmq` source) and parses each
message once:

* telemetry: every valid message once (deduplicated on device and seq), the `late` table:
  messages that came behind the watermark (`spark.arrivals`), and the `quarantine` table: every
  malformed message, with the reason.

Two read the `telemetry` table as it grows (Delta's streaming source), so a message is read from
the broker and parsed once rather than four times, and they count what `telemetry` holds:

* line_minute: per line and minute, appended once the watermark has passed the minute;
* intervals: per device, closed state and alarm intervals (`state_intervals`,
  `alarm_intervals`), with the broker's disconnect events when devices' ClientIds are known;
  after each micro-batch `availability` and `alarm_summary` are recomputed for the days it
  touched.

Every table is a Delta table (`spark.delta`). line_minute writes through Delta's streaming
sink; the telemetry and intervals queries append each micro-batch's rows to their tables with
the batch id, which Delta records in the same commit and skips when Spark replays
the batch after a crash. So a query stopped or killed at any point and restarted from its
checkpoint counts every message once, and a reader sees a micro-batch's rows all or not at all.
Messages are deduplicated on (device, seq) within the watermark (a QoS 1 retransmission is
stored twice). A message's event time is its device's timestamp unless that is too far ahead of
the broker's store time (`tables.parse`), so no device moves the watermark past the others.
Table layouts: docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import StructType

from spark import delta, tables
from spark.arrivals import DEVICE_BUCKETS, BucketSeen, sort_bucket
from spark.intervals import BucketTracks, days_touched
from spark.job_config import LAYOUTS, JobConfig, dated
from spark.options import parse_options
from spark.running import supervise
from spark.shifts import Shifts
from spark.source import start_offsets

log = logging.getLogger("spark.stream")


def _bucket_tracker(shifts: Shifts):  # type: ignore[no-untyped-def]
    def track_bucket(
        key: tuple[int], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        """applyInPandasWithState: one bucket of devices' new messages (or a timeout) -> closed
        intervals (`spark.intervals.BucketTracks`)."""
        tracks = (
            BucketTracks.from_json(state.get[0], shifts) if state.exists else BucketTracks(shifts)
        )
        samples = {} if state.hasTimedOut else tables.samples_by_device(pd.concat(list(frames)))
        watermark = state.getCurrentWatermarkMs()
        closed, late = tracks.advance(samples, watermark)
        for device, count in late.items():
            log.warning(
                "device %s: %d messages older than ones already applied; left out", device, count
            )
        if not tracks.tracks:
            state.remove()
            return
        state.update((tracks.to_json(),))
        # Called again once the watermark passes a track's oldest pending message, or the shift
        # start where its running state is cut.
        due = tracks.due
        if due is not None:
            state.setTimeoutTimestamp(max(due, watermark + 1))
        if closed:  # an empty frame would only be concatenated away
            yield tables.interval_frame(closed)

    return track_bucket


def _sort_bucket_arrivals(
    key: tuple[int], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """applyInPandasWithState without a timeout (so Spark passes on the rows behind the
    watermark too): the new rows of one bucket of devices (`spark.arrivals.DEVICE_BUCKETS`) ->
    those that count and the late ones (`spark.arrivals.sort_bucket`), and the malformed ones
    (spread over the buckets by where they are stored), as ARRIVALS_DDL rows."""
    frame = pd.concat(list(frames), ignore_index=True)
    if frame.empty:
        return
    malformed = frame["error"].notna()
    quarantined = frame[malformed]
    frame = frame[~malformed].reset_index(drop=True)
    seen = BucketSeen.from_json(state.get[0]) if state.exists else BucketSeen()
    watermark = state.getCurrentWatermarkMs()
    result = sort_bucket(
        list(
            zip(
                frame["device"].tolist(),
                # int64 unless malformed rows (null) came in the same frame: float64 then
                frame["seq"].astype("int64").tolist(),
                frame["ts_ms"].astype("int64").tolist(),
                strict=True,
            )
        ),
        seen,
        watermark,
    )
    if seen.devices:
        state.update((seen.to_json(),))
    else:
        state.remove()  # nothing within the watermark: quiet devices keep no state
    if result.late:
        late = frame.iloc[result.late]
        for device, count in late["device"].value_counts().items():
            log.warning(
                "device %s: %d messages behind the watermark; written to the late table",
                device,
                count,
            )
    rows = pd.concat(
        [
            frame.iloc[result.counted].assign(arrival="counted"),
            frame.iloc[result.late].assign(arrival="late"),
            quarantined.assign(arrival="quarantine"),
        ],
        ignore_index=True,
    )
    if not rows.empty:
        rows["watermark"] = pd.Timestamp(watermark, unit="ms", tz="UTC")
        yield rows[tables.ARRIVALS_COLUMNS]


class BatchWriter:
    """Appends a streaming query's micro-batches to its tables, each batch at most once per
    table (`delta.append_batch`, under the query's id from `checkpoint`)."""

    def __init__(self, config: JobConfig, checkpoint: Path) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.app_ids: dict[str, str] = {}

    def append(self, frame: DataFrame, name: str, batch_id: int) -> None:
        app_id = self.app_ids.get(name)
        if app_id is None:
            app_id = delta.query_app_id(frame.sparkSession, str(self.checkpoint), name)
            self.app_ids[name] = app_id
        rows = dated(frame, name, self.config.shifts)
        delta.append_batch(rows, self.config.table(name), LAYOUTS[name].partition, app_id, batch_id)


def _arrivals_batch(config: JobConfig, checkpoint: Path):  # type: ignore[no-untyped-def]
    tables_out = BatchWriter(config, checkpoint)

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.cache()
        try:
            kinds = {row[0] for row in batch.select("arrival").distinct().collect()}
            if "counted" in kinds:
                counted = batch.where(F.col("arrival") == "counted")
                tables_out.append(counted.select(*tables.TELEMETRY_COLUMNS), "telemetry", batch_id)
            if "late" in kinds:
                late = batch.where(F.col("arrival") == "late")
                tables_out.append(late.select(*tables.LATE_COLUMNS), "late", batch_id)
            if "quarantine" in kinds:
                bad = batch.where(F.col("arrival") == "quarantine")
                tables_out.append(bad.select(*tables.QUARANTINE_COLUMNS), "quarantine", batch_id)
        finally:
            batch.unpersist()

    return write


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


def _intervals_batch(  # type: ignore[no-untyped-def]
    config: JobConfig, gold: GoldRefresher, checkpoint: Path
):
    tables_out = BatchWriter(config, checkpoint)

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.cache()
        try:
            tables_out.append(tables.state_intervals(batch), "state_intervals", batch_id)
            tables_out.append(tables.alarm_intervals(batch), "alarm_intervals", batch_id)
            closed = batch.select("kind", F.unix_millis("start"), F.unix_millis("end")).collect()
            gold.add(days_touched(closed, config.shifts))
            gold.maybe_refresh(batch.sparkSession)
        finally:
            batch.unpersist()

    return write


def refresh_gold(spark: SparkSession, config: JobConfig, days: list[str]) -> None:
    """Recompute `availability` (shift dates) and `alarm_summary` (alarm start dates) for
    `days` from the interval tables, replacing those days' partitions."""
    # A shift of local day d lies within [d 00:00, d+2 00:00) local time: its start is a time
    # of day d, and it ends at the latest at the first shift start of d+1. A day either side
    # covers every time zone's offset from UTC.
    first = datetime.fromisoformat(min(days)).replace(tzinfo=UTC) - timedelta(days=1)
    last = datetime.fromisoformat(max(days)).replace(tzinfo=UTC) + timedelta(days=3)
    states = delta.read(spark, config.table("state_intervals"))
    if states is not None:
        # An interval is cut at every shift start, so none is longer than a shift (at most a
        # day): the date partitions from the day before `first` hold every one that overlaps.
        states = states.where(
            (F.col("date") >= (first - timedelta(days=1)).date().isoformat())
            & (F.col("date") < last.date().isoformat())
        )
        overlapping = states.where((F.col("end") > F.lit(first)) & (F.col("start") < F.lit(last)))
        table = tables.availability(overlapping, config.shifts).where(
            F.col("shift_date").isin(days)
        )
        delta.replace_partitions(table, config.table("availability"), "shift_date", days)
    alarms = delta.read(spark, config.table("alarm_intervals"))
    if alarms is not None:
        # An alarm counts on the plant's date of its start: its interval's `date`.
        summary = tables.alarm_summary(alarms.where(F.col("date").isin(days)), config.shifts)
        delta.replace_partitions(summary, config.table("alarm_summary"), "date", days)


STAGES = (("telemetry",), ("line_minute", "intervals"))
"""The queries in the order they depend on each other: the second pair reads the `telemetry`
table the first query writes."""


def telemetry_schema(spark: SparkSession, config: JobConfig) -> StructType:
    """The `telemetry` table's columns, as the telemetry query writes them."""
    rows = spark.createDataFrame([], tables.ARRIVALS_DDL).select(*tables.TELEMETRY_COLUMNS)
    return dated(rows, "telemetry", config.shifts).schema


def staged(
    starters: dict[str, Callable[[], StreamingQuery]],
) -> list[dict[str, Callable[[], StreamingQuery]]]:
    """`starters` grouped by `STAGES`, for `spark.running.supervise`."""
    return [{name: starters[name] for name in stage if name in starters} for stage in STAGES]


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
    """The three queries, by name, each as a function that starts it; a query resumes from its
    checkpoint under `checkpoint`, so starting one again after it failed is exactly-once.

    telemetry reads the broker (`rocketmq` source); a new one starts at `starting_offsets`,
    resolved here (as are the disconnect events' for intervals, so that both start at the
    offsets of the job's start, not each at its own first trigger). line_minute and intervals
    read the `telemetry` table, so a message is read from the broker and parsed once, not four
    times, and they count exactly what `telemetry` holds (`STAGES`: with `available_now` they
    run once telemetry is done)."""

    def resolved(source: dict[str, str]) -> dict[str, str]:
        start = start_offsets(
            parse_options({**source, "startingOffsets": starting_offsets}, streaming=True)
        )
        source = {**source, "startingOffsets": json.dumps(start)}
        if max_per_trigger:
            source["maxMessagesPerTrigger"] = str(max_per_trigger)
        return source

    options = resolved(config.source_options())
    presence_source = config.presence_options()
    presence = None if presence_source is None else resolved(presence_source)

    watermark = f"{config.watermark_s} seconds"
    # The stateful queries keep their state a bucket of devices per key (spark.arrivals).
    device_bucket = F.pmod(F.xxhash64("device"), F.lit(DEVICE_BUCKETS))

    def parsed() -> DataFrame:
        raw = spark.readStream.format("rocketmq").options(**options).load()
        return tables.parse(raw, config.max_clock_ahead_s)

    # The telemetry table is where the downstream queries read, so it exists before they start.
    delta.ensure_table(spark, config.table("telemetry"), telemetry_schema(spark, config), "date")

    def counted() -> DataFrame:
        """The `telemetry` table as a stream: every valid message once, parsed once (by the
        telemetry query), in the order that query committed them, each commit whole. A
        downstream batch so never holds part of a telemetry batch whose other part came
        before it: its watermark is never ahead of the telemetry query's, and nothing
        counted there is late here."""
        rows = (
            spark.readStream.format("delta")
            .option("maxFilesPerTrigger", str(2**31 - 1))
            .load(config.table("telemetry"))
        )
        return rows.withColumn("ts_ms", F.unix_millis("ts")).withWatermark("ts", watermark)

    def with_disconnects(columns: list[str]) -> DataFrame:
        rows = counted().select(*columns)
        if presence is None:
            return rows
        # The broker's disconnect events as OFFLINE rows, under the telemetry table's watermark
        # alone: Spark's global watermark is its slowest input's, so a watermark of their own
        # would hold every interval back to the last disconnect for as long as the devices
        # stay connected. An event copy (stored twice) is one the track has applied already.
        raw = spark.readStream.format("rocketmq").options(**presence).load()
        events = tables.valid(tables.parse(raw, config.max_clock_ahead_s, config.device_client_ids))
        return rows.unionByName(events.select(*columns))

    def trigger(writer):  # type: ignore[no-untyped-def]
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{trigger_s} seconds")

    ck = Path(checkpoint)

    def to_table(frame: Callable[[], DataFrame], name: str) -> Callable[[], StreamingQuery]:
        def start() -> StreamingQuery:
            # Delta's streaming sink: each micro-batch one commit, recorded with the query's
            # id and the batch id, so a replayed batch is not written twice.
            writer = (
                dated(frame(), name, config.shifts)
                .writeStream.format("delta")
                .outputMode("append")
                .partitionBy(LAYOUTS[name].partition)
                .option("path", config.table(name))
                .option("checkpointLocation", str(ck / name))
            )
            return trigger(writer).queryName(name).start()

        return start

    if gold is None:
        gold = GoldRefresher(config, ck / "intervals", 0.0 if available_now else 60.0)
    batch_writer = _intervals_batch(config, gold, ck / "intervals")

    def arrivals() -> StreamingQuery:
        # Malformed rows come along, for the quarantine table (read and parsed once for both).
        # Their event time is null, which leaves the watermark (the newest time less the delay)
        # where the valid rows put it.
        rows = parsed().withWatermark("ts", watermark)
        sorted_rows = (
            rows.select(
                *tables.TELEMETRY_COLUMNS,
                "ts_ms",
                "error",
                F.when(F.col("error").isNotNull(), F.col("payload")).alias("payload"),
                "publish_time",
                "broker",
                "queue",
                "offset",
                # A malformed row has no device: spread by where it is stored, so a flood of
                # them is not one group held by one Python worker.
                F.when(F.col("device").isNotNull(), device_bucket)
                .otherwise(F.pmod(F.xxhash64("broker", "queue", "offset"), F.lit(DEVICE_BUCKETS)))
                .alias("device_bucket"),
            )
            .groupBy("device_bucket")
            .applyInPandasWithState(
                _sort_bucket_arrivals,
                tables.ARRIVALS_DDL,
                "seen STRING",
                "append",
                GroupStateTimeout.NoTimeout,
            )
            # Per micro-batch, in the query's progress (`observedMetrics`).
            .observe(
                "arrivals",
                F.count_if(F.col("arrival") == "late").alias("late_rows"),
                F.count_if(F.col("arrival") == "quarantine").alias("quarantined_rows"),
                F.count_if((F.col("arrival") == "counted") & F.col("clock_ahead")).alias(
                    "clock_ahead_rows"
                ),
            )
        )
        writer = sorted_rows.writeStream.foreachBatch(_arrivals_batch(config, ck / "telemetry"))
        return (
            trigger(writer.option("checkpointLocation", str(ck / "telemetry")))
            .queryName("telemetry")
            .start()
        )

    def intervals() -> StreamingQuery:
        columns = ["device", "line", "station", "seq", "ts", "ts_ms", "state", "alarms"]
        stateful = (
            with_disconnects(columns)
            .withColumn("device_bucket", device_bucket)
            .groupBy("device_bucket")
            .applyInPandasWithState(
                _bucket_tracker(config.shifts),
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
        "telemetry": arrivals,
        "line_minute": to_table(lambda: tables.line_minute(counted()), "line_minute"),
        "intervals": intervals,
    }


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
        staged(
            stream_starters(
                spark,
                config,
                args.checkpoint,
                trigger_s=args.trigger,
                available_now=args.available_now,
                max_per_trigger=args.max_per_trigger,
                starting_offsets=args.starting_offsets,
                gold=gold,
            )
        ),
        finish,
        available_now=args.available_now,
        deadline=None if args.run_for is None else time.monotonic() + args.run_for,
        stop=stop,
    )
