"""The factory BI jobs end to end: telemetry published over MQTT through a bridge into the real
RocketMQ, then the back-fill and the streaming job (a real local Spark), with every table
compared row for row with what the published messages must give.

The streaming job first loses one query's source (its Python worker, SIGKILL), which it
restarts alone; then the whole job is killed with SIGKILL part-way (driver and JVM,
mid-micro-batch as it happens) and restarted from its checkpoints: every count must still be
exact, nothing lost and nothing counted twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.intervals import Sample, Shifts, batch_intervals
from spark.jobs import ALL_TABLES, JobConfig, read_table, run_backfill
from spark.telemetry import TOPIC_PREFIX, Device, encode, validate
from tests.spark.conftest import publish_all, unique
from tests.support.processes import BridgeProcess

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

START_MS = 1_767_592_800_000 - 20 * 60_000
"""2026-01-05T05:40Z: the data crosses the 06:00 shift change."""
SPAN_MS = 30 * 60_000
CLOCK_MS = START_MS + 3 * 3_600_000
"""A message this far in the device future moves the watermark past everything else."""


def telemetry(top: str) -> tuple[list[tuple[str, bytes]], list[dict]]:
    """(what to publish, the valid messages among it): 2 lines x 2 devices over 30 minutes, in
    device-time order as devices running side by side publish them; five messages sent twice
    in a row (as a QoS 1 retransmission stores them), three malformed ones."""
    timeline: list[tuple[int, str, dict]] = []
    for n, (line, device) in enumerate(
        [("L1", "L1-D01"), ("L1", "L1-D02"), ("L2", "L2-D01"), ("L2", "L2-D02")]
    ):
        model = Device(line, f"S{n + 1}", device, seed=100 + n, start_ms=START_MS, interval_s=10)
        while model.clock_ms < START_MS + SPAN_MS:
            for message in model.step():
                timeline.append((message["ts"], f"{top}/{line}/{device}/telemetry", message))
    timeline.sort(key=lambda item: item[0])
    published: list[tuple[str, bytes]] = []
    valid: list[dict] = []
    for index, (_, topic, message) in enumerate(timeline):
        published.append((topic, encode(message)))
        valid.append(message)
        if index in (3, 50, 120, 200, 260):
            published.append((topic, encode(message)))  # stored twice, counted once
    clock = {"v": 1, "device": "clock", "line": "ZZ", "station": "S0", "seq": 0,
             "ts": CLOCK_MS, "state": "IDLE", "good": 0, "bad": 0, "alarms": []}  # fmt: skip
    published.append((f"{top}/ZZ/clock/telemetry", encode(clock)))
    valid.append(clock)
    published += [
        (f"{top}/L1/L1-D01/telemetry", b"{not json"),
        (f"{top}/L1/L1-D01/telemetry", b'{"v":1,"device":"L1-D01"}'),
        (f"{top}/L2/L2-D02/telemetry", encode({**valid[0], "state": "EXPLODED"})),
    ]
    return published, valid


def rows(frame: DataFrame | None, *columns: str) -> Counter[tuple]:
    """A table's rows as a multiset of tuples, timestamps as epoch milliseconds."""
    assert frame is not None, "table not written"
    selected = [
        F.unix_millis(F.col(c)).alias(c) if dict(frame.dtypes)[c] == "timestamp" else F.col(c)
        for c in columns
    ]
    return Counter(tuple(r) for r in frame.select(*selected).collect())


def minute(ts: int) -> int:
    return ts - ts % 60_000


def expected_tables(valid: list[dict], published: list[tuple[str, bytes]]) -> dict[str, Counter]:
    unique_messages = list({(m["device"], m["seq"]): m for m in valid}.values())
    out: dict[str, Counter] = {}
    out["telemetry"] = Counter(
        (m["device"], m["seq"], m["ts"], m["state"], m["good"], m["bad"]) for m in unique_messages
    )
    out["quarantine"] = Counter(
        (reason, payload)
        for _, payload in published
        if (reason := validate(payload)[1]) is not None
    )
    per_minute: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for m in unique_messages:
        cell = per_minute[(m["line"], minute(m["ts"]))]
        cell[0] += m["good"]
        cell[1] += m["bad"]
        cell[2] += 1
    out["line_minute"] = Counter(
        (line, at, good, bad, good + bad, messages)
        for (line, at), (good, bad, messages) in per_minute.items()
    )
    by_device: dict[str, list[Sample]] = defaultdict(list)
    for m in unique_messages:
        by_device[m["device"]].append(
            Sample(m["ts"], m["seq"], m["state"], frozenset(m["alarms"]), m["line"], m["station"])
        )
    intervals = [i for d, s in by_device.items() for i in batch_intervals(d, s)]
    out["state_intervals"] = Counter(
        (i.device, i.what, i.start, i.end) for i in intervals if i.kind == "state"
    )
    out["alarm_intervals"] = Counter(
        (i.device, i.what, i.start, i.end) for i in intervals if i.kind == "alarm"
    )
    shift_seconds: dict[tuple[str, str, int], dict[str, float]] = defaultdict(
        lambda: defaultdict(float)
    )
    for i in intervals:
        if i.kind == "state":
            for date, number, _, ms in Shifts().pieces(i.start, i.end):
                shift_seconds[(i.device, date, number)][i.what] += ms / 1000
    out["availability"] = Counter(
        (device, date, number, round(s["RUNNING"], 3), round(sum(s.values()), 3))
        for (device, date, number), s in shift_seconds.items()
    )
    return out


def actual_tables(spark: SparkSession, out: Path) -> dict[str, Counter]:
    config = JobConfig(out=str(out))

    def table(name: str) -> DataFrame | None:
        return read_table(spark, config, name)

    availability = table("availability")
    assert availability is not None
    availability = availability.select(
        "device",
        F.col("shift_date").cast("string").alias("shift_date"),
        "shift",
        F.round("running_s", 3).alias("running_s"),
        F.round("observed_s", 3).alias("observed_s"),
    )
    return {
        "telemetry": rows(table("telemetry"), "device", "seq", "ts", "state", "good", "bad"),
        "quarantine": Counter(
            (r.error, bytes(r.payload))
            for r in table("quarantine").collect()  # type: ignore[union-attr]
        ),
        "line_minute": rows(
            table("line_minute"), "line", "minute", "good", "bad", "total", "messages"
        ),
        "state_intervals": rows(table("state_intervals"), "device", "state", "start", "end"),
        "alarm_intervals": rows(table("alarm_intervals"), "device", "code", "start", "end"),
        "availability": rows(availability, *availability.columns),
    }


def without_open_minute(table: Counter) -> Counter:
    """line_minute without line ZZ's minute: nothing after it closes it in a stream."""
    return Counter({row: n for row, n in table.items() if row[0] != "ZZ"})


@pytest.fixture
def published(rocketmq_bridge: BridgeProcess) -> tuple[str, list[tuple[str, bytes]], list[dict]]:
    top = unique("bi")
    messages, valid = telemetry(top)
    publish_all(rocketmq_bridge.port, messages, client_id=unique("plant-gw-"))
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
                       topic_filter=f"{top}/+/+/telemetry")  # fmt: skip
    counts = run_backfill(spark, config, None, None)
    expected = expected_tables(valid, messages)
    actual = actual_tables(spark, tmp_path / "bi")
    for name, table in expected.items():
        assert actual[name] == table, name
    assert counts["quarantine"] == 3
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
        *extra,
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


def commits(ck: Path, query: str) -> int:
    directory = ck / query / "commits"
    return len([p for p in directory.iterdir() if p.name.isdigit()]) if directory.exists() else 0


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen, log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            errors = [line for line in log.read_text(errors="replace").splitlines()
                      if "ERROR" in line or line.startswith(("error:", "Caused by"))]  # fmt: skip
            raise AssertionError(
                f"the stream job exited early ({process.returncode}):\n" + "\n".join(errors[-12:])
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


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
        # linger a moment: wait until there is one per query.
        wait_for(lambda: len(source_runners(job)) == 4, 120, "a source worker per query", job, log)
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
    done = commits(ck, "intervals")
    assert done * per_trigger < len(messages), "the job was not stopped part-way"
    # Restart from the checkpoints and process what is left, then stop.
    rerun = stream_job(rocketmq.namesrv_addr, top, out, ck, "--available-now")
    try:
        assert rerun.wait(400) == 0, (out.parent / "stream.log").read_text()[-3000:]
    finally:
        kill_group(rerun)
    expected = expected_tables(valid, messages)
    actual = actual_tables(spark, out)
    expected["line_minute"] = without_open_minute(expected["line_minute"])
    for name, table in expected.items():
        assert actual[name] == table, name
