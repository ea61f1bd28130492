"""Event time a device cannot break: a device's clock far ahead of the broker's is not believed.

The scenario of the issue, on the real RocketMQ through a bridge: device L1-A sends readings
with a correct clock, device L2-X one reading three hours ahead; a stream run (available-now);
then L1-A sends more; a second run on the same checkpoints. A watermark moved by L2-X would drop
every later reading of everyone, silently. Both runs are the job's own telemetry query
(`stream_starters`) in this process's Spark session.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from spark.job_config import JobConfig
from spark.jobs import read_table
from spark.running import supervise
from spark.stream import stream_starters
from spark.telemetry import encode, telemetry_topic
from tests.spark.conftest import publish_all, unique
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

AHEAD_MS = 3 * 3_600_000


def reading(site: str, line: str, device: str, seq: int, ts_ms: int) -> tuple[str, bytes]:
    message = {"v": 1, "device": device, "line": line, "station": "S1", "seq": seq,
               "ts": ts_ms, "state": "RUNNING", "good": 1, "bad": 0, "alarms": []}  # fmt: skip
    return f"{site}/{telemetry_topic(line, device).split('/', 1)[1]}", encode(message)


def run_available_now(spark: SparkSession, config: JobConfig, ck: Path) -> None:
    """The stream job's telemetry query (which writes `telemetry` and `late`) until it has read
    what is stored; the other three are not needed here."""
    starters = stream_starters(spark, config, str(ck), available_now=True)
    status = supervise(
        [{"telemetry": starters["telemetry"]}],
        lambda: None,
        available_now=True,
        deadline=time.monotonic() + 240,
        stop=threading.Event(),
    )
    assert status == 0


class Progress(StreamingQueryListener):
    """Sums what the telemetry query counts in its progress (`observedMetrics.arrivals`)."""

    def __init__(self) -> None:
        self.clock_ahead = 0
        self.late = 0
        self.batches = 0

    def onQueryStarted(self, event: object) -> None:
        pass

    def onQueryProgress(self, event: object) -> None:
        progress = event.progress  # type: ignore[attr-defined]
        if progress.name == "telemetry" and "arrivals" in progress.observedMetrics:
            counted = progress.observedMetrics["arrivals"]
            self.clock_ahead += counted["clock_ahead_rows"]
            self.late += counted["late_rows"]
            self.batches += 1

    def onQueryIdle(self, event: object) -> None:
        pass

    def onQueryTerminated(self, event: object) -> None:
        pass

    def wait(self, batches: int) -> None:
        """Until `batches` progress events came (they reach Python listeners a moment after
        the query ends)."""
        deadline = time.monotonic() + 30
        while self.batches < batches and time.monotonic() < deadline:
            time.sleep(0.2)


def test_a_device_clock_hours_ahead_neither_moves_the_watermark_nor_loses_its_own_row(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess, tmp_path: Path
) -> None:
    site = unique("et")
    config = JobConfig(
        out=str(tmp_path / "bi"),
        nameserver=rocketmq.namesrv_addr,
        topic_filter=f"{site}/+/+/telemetry",
    )
    progress = Progress()
    spark.streams.addListener(progress)
    now = int(time.time() * 1000)
    first = [reading(site, "L1", "L1-A", i, now - 10_000 + i * 500) for i in range(10)]
    publish_all(rocketmq_bridge.port, [*first, reading(site, "L2", "L2-X", 0, now + AHEAD_MS)])
    run_available_now(spark, config, tmp_path / "ck")

    later = int(time.time() * 1000)
    more = [reading(site, "L1", "L1-A", 10 + i, later + i * 500) for i in range(10)]
    publish_all(rocketmq_bridge.port, more)
    run_available_now(spark, config, tmp_path / "ck")
    progress.wait(2)
    spark.streams.removeListener(progress)
    assert progress.clock_ahead == 1, "the progress counts the row whose clock was not believed"
    assert progress.late == 0

    telemetry = read_table(spark, config, "telemetry")
    assert telemetry is not None
    got = {
        (r.device, r.seq): r
        for r in telemetry.select(
            "device", "seq", F.unix_millis("ts").alias("ts"),
            F.unix_millis("device_ts").alias("device_ts"), "clock_ahead",
            F.unix_millis("store_time").alias("store"),
        ).collect()
    }  # fmt: skip
    assert sorted(s for d, s in got if d == "L1-A") == list(range(20)), "a reading was dropped"
    assert not any(r.clock_ahead for (d, _), r in got.items() if d == "L1-A")
    fast = got[("L2-X", 0)]
    assert fast.clock_ahead and fast.device_ts == now + AHEAD_MS
    assert fast.ts == fast.store, "its row counts at the time the broker stored it"


def test_a_device_back_from_an_outage_has_its_old_readings_in_the_late_table(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess, tmp_path: Path
) -> None:
    """L1-A runs with a correct clock; the watermark follows it. L1-B, back after ten minutes
    offline, sends what it buffered: behind the watermark, so the minutes and intervals of
    that time are closed. Its readings are in `late` with the watermark they missed, not in
    `telemetry`, and not silently gone."""
    progress = Progress()
    spark.streams.addListener(progress)
    site = unique("lt")
    config = JobConfig(
        out=str(tmp_path / "bi"),
        nameserver=rocketmq.namesrv_addr,
        topic_filter=f"{site}/+/+/telemetry",
    )
    now = int(time.time() * 1000)
    publish_all(
        rocketmq_bridge.port, [reading(site, "L1", "L1-A", i, now + i * 500) for i in range(5)]
    )
    run_available_now(spark, config, tmp_path / "ck")
    buffered = [reading(site, "L1", "L1-B", i, now - 600_000 + i * 1_000) for i in range(4)]
    publish_all(rocketmq_bridge.port, [*buffered, reading(site, "L1", "L1-A", 5, now + 3_000)])
    run_available_now(spark, config, tmp_path / "ck")
    progress.wait(2)
    spark.streams.removeListener(progress)
    assert progress.late == 4, "the progress counts the late rows"

    telemetry = read_table(spark, config, "telemetry")
    late = read_table(spark, config, "late")
    assert telemetry is not None and late is not None, "no late table"
    assert sorted((r.device, r.seq) for r in telemetry.collect()) == [("L1-A", i) for i in range(6)]
    got = late.select("device", "seq", F.unix_millis("ts").alias("ts"),
                      F.unix_millis("watermark").alias("watermark")).collect()  # fmt: skip
    assert sorted((r.device, r.seq) for r in got) == [("L1-B", i) for i in range(4)]
    assert all(r.ts < r.watermark == now + 2_000 - 120_000 for r in got)
