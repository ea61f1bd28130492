"""The factory BI jobs end to end: telemetry published over MQTT through a bridge into the real
RocketMQ, then the back-fill and the streaming job (a real local Spark), with every table
compared row for row with what the published messages must give.

The streaming job first loses one query's source (its Python worker, SIGKILL), which it
restarts alone; then the whole job is killed with SIGKILL part-way (driver and JVM,
mid-micro-batch as it happens) and restarted from its checkpoints: every count must still be
exact, nothing lost and nothing counted twice. Both jobs know the devices' ClientIds, so the
device switched off in the factory day is OFFLINE from the broker's disconnect event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.job_config import ALL_TABLES, LAYOUTS, JobConfig
from spark.jobs import read_table, run_backfill, table_states
from spark.presence import DeviceClientIds
from spark.telemetry import TOPIC_PREFIX
from tests.spark.conftest import produce_backend_message, publish_all, unique
from tests.spark.factory_day import (
    CALENDAR,
    CALENDAR_ARGS,
    START_MS,
    actual_tables,
    device_client_id,
    expected_tables,
    power_off,
    rows,
    telemetry,
    without_open_minute,
)
from tests.spark.job_process import commits, kill_group, wait_for
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]


@pytest.fixture
def published(
    rocketmq_bridge: BridgeProcess, rocketmq
) -> tuple[str, list[tuple[str, bytes]], list[dict]]:
    top = unique("bi")
    messages, valid = telemetry(top)
    publish_all(rocketmq_bridge.port, messages, client_id=unique("plant-gw-"))
    # The device switched off: its disconnect event, stored as a node stores it (the event's
    # time is the factory day's, which a node's own clock cannot give).
    event_topic, event = power_off(top)
    produce_backend_message(rocketmq.namesrv_addr, event_topic, event, {})
    return top, messages, valid


def test_back_fill_of_only_malformed_payloads_writes_empty_tables_and_the_quarantine(
    spark: SparkSession, bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    # The embedded store: the bridge's log is read by the same source, no broker needed.
    bridge = bridge_factory("client_events=false")
    junk = [(f"{TOPIC_PREFIX}/L1/press{i % 3}/telemetry", b"not json %d" % i) for i in range(12)]
    publish_all(bridge.port, junk)
    config = JobConfig(out=str(tmp_path / "bi"), path=str(bridge.data_dir))

    counts = run_backfill(spark, config, None, None)

    assert counts == {name: 12 if name == "quarantine" else 0 for name in ALL_TABLES}
    quarantine = read_table(spark, config, "quarantine")
    assert quarantine is not None and quarantine.count() == 12


def test_back_fill_builds_every_table_exactly_and_quarantines_malformed_payloads(
    spark: SparkSession, rocketmq, published, tmp_path: Path
) -> None:
    top, messages, valid = published
    config = JobConfig(out=str(tmp_path / "bi"), nameserver=rocketmq.namesrv_addr,
                       topic_filter=f"{top}/+/+/telemetry", shifts=CALENDAR,
                       device_client_ids=DeviceClientIds(device_client_id(top)))  # fmt: skip
    counts = run_backfill(spark, config, None, None)
    expected = expected_tables(valid, messages, offline=True)
    actual = actual_tables(spark, tmp_path / "bi")
    for name, table in expected.items():
        assert actual[name] == table, name
    assert counts["quarantine"] == 3
    states = {state.name: state for state in table_states(spark, config)}
    assert {name: state.partitioned_by for name, state in states.items()} == {
        name: (LAYOUTS[name].partition,) for name in ALL_TABLES
    }
    assert states["telemetry"].newest is not None
    assert {reason for reason, _ in actual["quarantine"]} == {
        "not JSON",
        "missing field 'line'",
        "unknown state 'EXPLODED'",
    }
    # A back-fill over a range of device time takes only the messages inside it.
    start, end = START_MS + 10 * 60_000, START_MS + 20 * 60_000
    run_backfill(spark, config, start, end)
    inside = rows(read_table(spark, config, "telemetry"), "ts")
    assert inside and all(start <= ts < end for (ts,) in inside)
    assert sum(inside.values()) == len(
        {(m["device"], m["seq"]) for m in valid if start <= m["ts"] < end}
    )


def stream_job(nameserver: str, top: str, out: Path, ck: Path, *extra: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "spark.jobs", "stream", "--nameserver", nameserver,
        "--topic-filter", f"{top}/+/+/telemetry", "--out", str(out), "--checkpoint", str(ck),
        "--device-client-id", device_client_id(top), *CALENDAR_ARGS, *extra,
    ]  # fmt: skip
    with open(out.parent / "stream.log", "ab") as log:
        return subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # its own process group: the JVM dies with the driver
        )


RESTARTED = "restarting it from its checkpoint"
"""What the job logs when it restarts a failed query."""


def source_runners(job: subprocess.Popen) -> list[int]:
    """PIDs of the stream job's Python workers that run its queries' sources (one per query)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != job.pid:
                continue
            command = (entry / "cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if b"python_streaming_source_runner" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(900)  # its waits are for a machine where other tests hold the CPU
def test_streaming_job_that_loses_a_query_and_then_is_killed_counts_every_message_exactly_once(
    spark: SparkSession, rocketmq, published, tmp_path: Path
) -> None:
    top, messages, valid = published
    out, ck = tmp_path / "bi", tmp_path / "ck"
    out.mkdir()
    per_trigger = 40
    job = stream_job(
        rocketmq.namesrv_addr, top, out, ck, "--trigger", "1", "--max-per-trigger", str(per_trigger)
    )
    log = tmp_path / "stream.log"
    try:
        # A query whose Python worker missed Spark's 10 s to connect back on a busy machine is
        # restarted, after a wait that doubles with each failure: the first commit of all four
        # can take minutes there.
        wait_for(lambda: commits(ck, "intervals") >= 1, 480, "a committed micro-batch", job, log)
        # One query's source dies (its Python worker, SIGKILL): that query alone is restarted
        # from its checkpoint while the others run on.
        # A worker that missed Spark's 10 s to connect back (the job restarted its query) may
        # linger a moment: wait until there is one per source reading the broker (telemetry's,
        # and the disconnect events' of intervals, which reads the rest from the telemetry
        # table; line_minute reads only that table).
        wait_for(lambda: len(source_runners(job)) == 2, 120, "a worker per source", job, log)
        restarts = log.read_text().count(RESTARTED)
        os.kill(source_runners(job)[0], signal.SIGKILL)
        wait_for(
            lambda: log.read_text().count(RESTARTED) > restarts,
            120,
            "the failed query's restart",
            job,
            log,
        )
        wait_for(lambda: commits(ck, "intervals") >= 2, 300, "two micro-batches", job, log)
    finally:
        kill_group(job)
    done = commits(ck, "telemetry")
    assert done * per_trigger < len(messages), "the job was not stopped part-way"
    # Restart from the checkpoints and process what is left, then stop.
    rerun = stream_job(rocketmq.namesrv_addr, top, out, ck, "--available-now")
    try:
        assert rerun.wait(400) == 0, (out.parent / "stream.log").read_text()[-3000:]
    finally:
        kill_group(rerun)
    expected = expected_tables(valid, messages, offline=True)
    actual = actual_tables(spark, out)
    expected["line_minute"] = without_open_minute(expected["line_minute"])
    for name, table in expected.items():
        assert actual[name] == table, name
