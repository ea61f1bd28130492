"""Event time a device cannot break: a device's clock far ahead of the broker's is not believed.

The scenario of the issue, on the real RocketMQ through a bridge: device L1-A sends readings
with a correct clock, device L2-X one reading three hours ahead; a stream run (available-now);
then L1-A sends more; a second run on the same checkpoints. A watermark moved by L2-X would drop
every later reading of everyone, silently. Both runs are the job's own queries
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

from spark.jobs import JobConfig, read_table, stream_starters
from spark.running import supervise
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
    status = supervise(
        stream_starters(spark, config, str(ck), available_now=True),
        lambda: None,
        available_now=True,
        deadline=time.monotonic() + 240,
        stop=threading.Event(),
    )
    assert status == 0


class ClockCount(StreamingQueryListener):
    """Sums the `clock` metric the telemetry query reports in its progress."""

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0

    def onQueryStarted(self, event: object) -> None:
        pass

    def onQueryProgress(self, event: object) -> None:
        progress = event.progress  # type: ignore[attr-defined]
        if progress.name == "telemetry" and "clock" in progress.observedMetrics:
            self.rows += progress.observedMetrics["clock"]["clock_ahead_rows"]
            self.batches += 1

    def onQueryIdle(self, event: object) -> None:
        pass

    def onQueryTerminated(self, event: object) -> None:
        pass


def test_a_device_clock_hours_ahead_neither_moves_the_watermark_nor_loses_its_own_row(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess, tmp_path: Path
) -> None:
    site = unique("et")
    config = JobConfig(
        out=str(tmp_path / "bi"),
        nameserver=rocketmq.namesrv_addr,
        topic_filter=f"{site}/+/+/telemetry",
    )
    clock = ClockCount()
    spark.streams.addListener(clock)
    now = int(time.time() * 1000)
    first = [reading(site, "L1", "L1-A", i, now - 10_000 + i * 500) for i in range(10)]
    publish_all(rocketmq_bridge.port, [*first, reading(site, "L2", "L2-X", 0, now + AHEAD_MS)])
    run_available_now(spark, config, tmp_path / "ck")

    later = int(time.time() * 1000)
    more = [reading(site, "L1", "L1-A", 10 + i, later + i * 500) for i in range(10)]
    publish_all(rocketmq_bridge.port, more)
    run_available_now(spark, config, tmp_path / "ck")
    deadline = time.monotonic() + 30  # progress events reach Python listeners a moment later
    while clock.batches < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    spark.streams.removeListener(clock)
    assert clock.rows == 1, "the progress counts the row whose clock was not believed"

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
