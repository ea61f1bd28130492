"""A device the broker lost is OFFLINE until it reports again, in the stream and the back-fill.

A bridge on the embedded store with client events on (its default): device L1-D01 connects as
itself, reports RUNNING with a warning raised, and disconnects; the node stores its `$SYS`
disconnect event. It comes back and reports RUNNING again. A gateway client that is no device
disconnects too. Both jobs run with `--device-client-id {device}` semantics (`JobConfig`): the
state before the disconnect closes at its time, OFFLINE lasts until the next report, the open
warning closes as "offline", and the gateway leaves no trace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark.job_config import JobConfig
from spark.jobs import read_table, run_backfill
from spark.presence import OFFLINE, DeviceClientIds
from spark.running import supervise
from spark.stream import stream_starters
from spark.telemetry import encode, telemetry_topic
from tests.spark.conftest import publish_all
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.timeout(600)


def reading(device: str, seq: int, ts_ms: int, alarms: list[str]) -> tuple[str, bytes]:
    message = {"v": 1, "device": device, "line": "L1", "station": "S1", "seq": seq,
               "ts": ts_ms, "state": "RUNNING", "good": 1, "bad": 0, "alarms": alarms}  # fmt: skip
    return telemetry_topic("L1", device), encode(message)


def now_ms() -> int:
    return int(time.time() * 1000)


def intervals_of(spark: SparkSession, config: JobConfig) -> tuple[list, list]:
    states = read_table(spark, config, "state_intervals")
    alarms = read_table(spark, config, "alarm_intervals")
    assert states is not None and alarms is not None

    def rows(frame, what: str) -> list:  # type: ignore[no-untyped-def]
        return sorted(
            tuple(r)
            for r in frame.select(
                "device", what, F.unix_millis("start"), F.unix_millis("end"), "closed_by"
            ).collect()
        )

    return rows(states, "state"), rows(alarms, "code")


def test_a_disconnected_device_is_offline_until_its_next_report_in_stream_and_back_fill(
    spark: SparkSession, bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    bridge = bridge_factory()
    first = now_ms()
    publish_all(bridge.port, [reading("L1-D01", 0, first, ["W201"])], client_id="L1-D01")
    # The node stamps L1-D01's disconnect event after its first report and before `back` (it
    # may process the DISCONNECT before this process reads its clock again).
    gone = now_ms()
    publish_all(bridge.port, [reading("L1-D02", 0, gone, [])], client_id="gateway-7")
    time.sleep(0.5)
    back = now_ms()
    publish_all(bridge.port, [reading("L1-D01", 1, back, [])], client_id="L1-D01")
    # With a watermark of 2 s, a later report lets the stream apply everything before it.
    time.sleep(2.5)
    publish_all(bridge.port, [reading("L1-D02", 1, now_ms(), [])], client_id="gateway-7")

    def config(name: str) -> JobConfig:
        return JobConfig(
            out=str(tmp_path / name),
            path=str(bridge.data_dir),
            watermark_s=2,
            max_clock_ahead_s=1,
            device_client_ids=DeviceClientIds("{device}"),
        )

    run_backfill(spark, config("bf"), None, None)
    starters = stream_starters(spark, config("st"), str(tmp_path / "ck"), available_now=True)
    # The intervals query reads the telemetry table, which the telemetry query writes first.
    status = supervise([{"telemetry": starters["telemetry"]}, {"intervals": starters["intervals"]}],
                       lambda: None, available_now=True, deadline=time.monotonic() + 240,
                       stop=threading.Event())  # fmt: skip
    assert status == 0

    states, alarms = intervals_of(spark, config("bf"))
    # Its second connection ended too: RUNNING again until that disconnect, then OFFLINE.
    by_start = sorted(states, key=lambda s: s[2])
    assert [(s[0], s[1], s[4]) for s in by_start] == [
        ("L1-D01", "RUNNING", "change"),
        ("L1-D01", OFFLINE, "change"),
        ("L1-D01", "RUNNING", "change"),
    ]
    running, offline, again = by_start
    assert running[2] == first and running[3] == offline[2]
    assert first <= offline[2] <= back and offline[3] == back == again[2]
    assert alarms == [("L1-D01", "W201", first, offline[2], "offline")]
    assert intervals_of(spark, config("st")) == (states, alarms)
    availability = read_table(spark, config("bf"), "availability")
    assert availability is not None
    rows = availability.where(F.col("device") == "L1-D01").collect()
    assert sum(r.offline_s for r in rows) == pytest.approx((back - offline[2]) / 1000)
    assert sum(r.observed_s for r in rows) == pytest.approx((again[3] - first) / 1000)
