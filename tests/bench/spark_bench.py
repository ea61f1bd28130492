#!/usr/bin/env python3
"""Spark benchmark: how fast the `rocketmq` data source reads, and how long a device's message
takes to reach the BI tables of `python -m spark.jobs stream`.

Run from the repository root (``make bench`` does this)::

    .venv/bin/python tests/bench/spark_bench.py [--messages N] [--runs N] [--e2e-seconds S]

Three measurements, each printed as a table as it finishes:

1. Batch read, RocketMQ: a LocalRocketMQ (deploy/rocketmq, own temp dir, free ports) is filled
   with ``--messages`` telemetry messages of `spark.telemetry.Device` (as `python -m
   spark.simulate` sends them), produced straight into RocketMQ with `RocketMQClient.send` and
   the bridge's own mapping (`to_rocketmq`), many sends in flight. Then a local Spark session
   (`spark.session.spark_session`, local[2]) reads all of it into the ``noop`` sink ``--runs``
   times: every column, only ``topic, payload``, and through `spark.tables.parse` (JSON
   validation in Python workers, what every job pays).
2. Batch read, embedded store: the same messages written with `FileLogStore` (the bridge's
   defaults: 64 MiB segments, fsync) and read with ``load(data_dir)``.
3. End to end: RocketMQ + a bridge (``store=rocketmq``) + ``python -m spark.jobs stream
   --trigger 5 --starting-offsets latest``, then ``python -m spark.simulate --time-scale 1``
   (device clocks = wall clock, so a row's ``ts`` is when it was published) for
   ``--e2e-seconds``. The harness polls the ``telemetry`` and ``line_minute`` directories every
   0.25 s; a row's delay is the time its Parquet file was first readable (and, second figure,
   first listed in the sink's ``_spark_metadata`` commit log, what a Spark reader goes by) minus
   its ``ts``. The issue's goal: ≤ 10 s with a 5 s trigger.

A ``line_minute`` row is appended only once the watermark (120 s of device time) has passed the
minute's end, so it needs about 190 s of running before the first one can appear: the default
``--e2e-seconds`` is 240 for that reason.

There is no Mosquitto counterpart of a Spark source, so, unlike the other benchmarks, no ratio
is printed. Bounded: message counts, a time cap on producing, writing and every Spark run
(cancelled past it), on start-up waits and on the simulator; every process started is stopped in
a ``finally`` (also on Ctrl-C and SIGTERM). Writes tests/bench/results/spark-bench.{json,md}
and the stream job's and bridge's logs (spark-bench-*.log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bridge.storage import FileLogStore
from bridge.storage.base import Message
from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.mapping import rocketmq_topic, to_rocketmq
from spark import telemetry
from spark.simulate import device_names
from tests.bench.harness.common import REPO, log, on_sigterm, tail
from tests.bench.harness.procfs import loadavg, machine_busy_s, proc_cpu
from tests.bench.harness.report import plain_table
from tests.bench.harness.rocketmq import DEFAULT_ROCKETMQ_JAVA_OPTS, is_rocketmq_jvm
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import LocalRocketMQ

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_PREFIX = "spark-bench"
TOPIC_ROOT = telemetry.TOPIC_PREFIX  # MQTT first level "factory" = RocketMQ topic "factory"
QUEUES = 4  # the broker's defaultTopicQueueNums, stated explicitly
PRODUCER_LINES, PRODUCER_DEVICES_PER_LINE = 4, 10
SEND_WINDOW = 512
PRODUCE_CAP_S = 300.0
WRITE_CAP_S = 300.0
SPARK_RUN_CAP_S = 600.0
# End to end: the simulator's load and the stream job's settings (those of the issue).
TRIGGER_S = 5
GOAL_S = 10.0
SIM_LINES, SIM_DEVICES_PER_LINE, SIM_RATE, SIM_INTERVAL_S = 4, 50, 400, 1
WATERMARK_S = 120  # spark.jobs' default --watermark
POLL_S = 0.25
WARMUP_S = 20.0
"""Rows published in the first seconds meet Python workers and code paths still starting up;
the delays are printed for every row and again for the rows after this."""
JOB_READY_CAP_S = 180.0
PROBE_LINE, PROBE_DEVICE = "P0", "P0-PROBE"
"""The stream job's queries resolve `--starting-offsets latest` at their first trigger, which
on a busy machine comes seconds after they start: the harness sends one telemetry message of
this device a second (straight into RocketMQ) until every query has planned a micro-batch
(an `offsets/` entry), so no simulated message is skipped and the Python workers are warm. Its
rows are left out of every figure."""
JOB_STOP_S = 45.0
QUERIES = ("telemetry", "quarantine", "line_minute", "intervals")


# --------------------------------------------------------------------------- processes and CPU


def _stat_fields(pid: str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def session_pids(sid: int) -> list[int]:
    """Live processes of a session (pyspark's worker daemon makes a process group of its own,
    so a process group would miss the Python workers)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(entry)
            # fields[0] is the state (field 3 of stat): session is field 6.
            if fields is not None and int(fields[3]) == sid:
                out.append(int(entry))
    return out


def session_cpu(sid: int) -> float:
    """CPU seconds of a session's live processes and the children they have reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in session_pids(sid):
        fields = _stat_fields(str(pid))
        if fields is not None:  # utime, stime, cutime, cstime: fields 14-17
            total += sum(int(v) for v in fields[11:15])
    return total / tick


def kill_session(sid: int) -> None:
    """SIGKILL every process left in a session this script started, by PID."""
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def children_cpu() -> float:
    """CPU seconds of this script's reaped children (the simulator, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def delay_stats(values: list[float]) -> dict[str, float | int | None]:
    """count, p50, p95, p99, max and the fraction within GOAL_S of some delays."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None, "within": None}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
        "within": sum(v <= GOAL_S for v in ordered) / len(ordered),
    }


def fmt_s(value: float | int | None, digits: int = 2) -> str:
    """Seconds (or any figure) for a table cell; "—" when missing."""
    return "—" if value is None else f"{value:.{digits}f}"


def fmt_rate(value: float | None) -> str:
    """A rate with thousands separators for a table cell; "—" when missing."""
    return "—" if value is None else f"{value:,.0f}"


# --------------------------------------------------------------------------- messages


def telemetry_messages(count: int) -> Iterator[Message]:
    """`count` messages of simulated devices (1 s sample interval, round-robin over devices),
    stamped as a bridge stamps them. Device clocks end about now."""
    devices = []
    now_ms = int(time.time() * 1000)
    names = device_names(PRODUCER_LINES, PRODUCER_DEVICES_PER_LINE)
    start_ms = now_ms - (count // len(names) + 1) * 1000
    for number, (line, station, name) in enumerate(names):
        devices.append(telemetry.Device(line, station, name, number, start_ms, 1.0))
    pending: list[list[dict[str, Any]]] = [[] for _ in devices]
    for i in range(count):
        index = i % len(devices)
        device = devices[index]
        if not pending[index]:
            pending[index] = device.step()
        sample = pending[index].pop(0)
        yield Message(
            topic=telemetry.telemetry_topic(device.line, device.device),
            payload=telemetry.encode(sample),
            qos=1,
            publisher=f"sim-{device.device}",
            key=f"spark-bench-{i}",
            timestamp_ms=int(time.time() * 1000),
            node="spark-bench",
        )


@dataclass
class Produced:
    """What a producing or writing phase did."""

    sent: int = 0
    failed: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


async def create_topic(nameserver: str) -> None:
    async with RocketMQClient(
        nameserver, client_id="spark-bench-admin", producer_group="bench"
    ) as c:
        await c.create_topic(
            rocketmq_topic(TOPIC_ROOT), read_queue_nums=QUEUES, write_queue_nums=QUEUES
        )


async def produce(nameserver: str, count: int) -> Produced:
    """Send `count` messages into RocketMQ, SEND_WINDOW in flight, for at most PRODUCE_CAP_S."""
    result = Produced()
    pending: set[asyncio.Task[Any]] = set()

    def settle(done: set[asyncio.Task[Any]]) -> None:
        for task in done:
            if task.exception() is None:
                result.sent += 1
            else:
                result.failed += 1
                if len(result.errors) < 5:
                    result.errors.append(repr(task.exception()))

    async with RocketMQClient(
        nameserver, client_id=f"spark-bench-{os.getpid()}", producer_group="spark-bench"
    ) as client:
        began = time.monotonic()
        deadline = began + PRODUCE_CAP_S
        for message in telemetry_messages(count):
            if time.monotonic() >= deadline:
                result.errors.append(f"stopped at the {PRODUCE_CAP_S:.0f} s cap")
                break
            while len(pending) >= SEND_WINDOW:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                settle(done)
            topic, tag, keys, properties, body = to_rocketmq(message, ())
            result.payload_bytes += len(body)
            send = client.send(topic, body, tags=tag, keys=keys, properties=properties)
            pending.add(asyncio.ensure_future(send))
        if pending:
            done, pending = await asyncio.wait(pending, timeout=60)
            settle(done)
            for task in pending:
                task.cancel()
            result.failed += len(pending)
        result.seconds = time.monotonic() - began
    return result


async def write_log(data_dir: Path, count: int) -> Produced:
    """Write `count` messages with FileLogStore (bridge defaults), 2,000 per group of submits."""
    result = Produced()
    store = FileLogStore(data_dir)
    await store.open()
    try:
        began = time.monotonic()
        batch: list[asyncio.Future[int]] = []
        for message in telemetry_messages(count):
            result.payload_bytes += len(message.payload)
            future = store.submit(message, ())
            assert future is not None
            batch.append(future)
            if len(batch) >= 2000:
                await asyncio.gather(*batch)
                result.sent += len(batch)
                batch = []
                if time.monotonic() - began >= WRITE_CAP_S:
                    result.errors.append(f"stopped at the {WRITE_CAP_S:.0f} s cap")
                    break
        await asyncio.gather(*batch)
        result.sent += len(batch)
        result.seconds = time.monotonic() - began
    finally:
        await store.close()
    return result


# --------------------------------------------------------------------------- Spark reads


@dataclass
class ReadResult:
    """The timed runs of one read."""

    name: str
    partitions: int | None
    seconds: list[float | None]
    rows: int

    def rates(self) -> list[float | None]:
        return [self.rows / s if s else None for s in self.seconds]

    def median_rate(self) -> float | None:
        done = [r for r in self.rates() if r is not None]
        return statistics.median(done) if done else None


def run_capped(spark: Any, label: str, action: Callable[[], object]) -> float | None:
    """Seconds `action` (Spark jobs) took; None if it failed or was cancelled at the cap."""
    sc = spark.sparkContext
    group = f"spark-bench-{label}-{time.monotonic_ns()}"
    sc.setJobGroup(group, label, interruptOnCancel=True)
    timer = threading.Timer(SPARK_RUN_CAP_S, sc.cancelJobGroup, args=[group])
    timer.start()
    began = time.perf_counter()
    try:
        action()
    except Exception as exc:  # a cancelled or failed job: the figure is missing, the run goes on
        log(f"    {label}: failed after {time.perf_counter() - began:.1f} s: {exc!s:.500}")
        return None
    finally:
        timer.cancel()
    return time.perf_counter() - began


def time_reads(spark: Any, name: str, frame: Callable[[], Any], runs: int, rows: int) -> ReadResult:
    partitions = None
    with contextlib.suppress(Exception):
        partitions = frame().rdd.getNumPartitions()
    seconds = []
    for run in range(runs):

        def save() -> None:
            frame().write.format("noop").mode("overwrite").save()

        took = run_capped(spark, f"{name}-{run + 1}", save)
        seconds.append(took)
        rate = f"{rows / took:,.0f} msg/s" if took else "—"
        log(f"    {name} run {run + 1}: {fmt_s(took)} s, {rate}")
    return ReadResult(name, partitions, seconds, rows)


def check_count(spark: Any, frame: Any, expected: int, label: str) -> float | None:
    """Count the rows once (a warm-up read that starts the Python workers); warn on mismatch."""
    counted: list[int] = []
    took = run_capped(spark, f"{label}-count", lambda: counted.append(frame.count()))
    if counted and counted[0] != expected:
        log(f"    WARNING: {label}: read {counted[0]} rows, expected {expected}")
    elif counted:
        log(f"    {label}: count() = {counted[0]} rows as expected ({fmt_s(took)} s, warm-up)")
    return took


def read_table(results: list[ReadResult]) -> str:
    """The batch reads as a plain-text table."""
    runs = max(len(r.seconds) for r in results)
    head = ["read", "partitions", *(f"run {i + 1} msg/s" for i in range(runs)), "median msg/s"]
    body = [
        [
            r.name,
            str(r.partitions) if r.partitions is not None else "?",
            *(fmt_rate(v) for v in r.rates()),
            fmt_rate(r.median_rate()),
        ]
        for r in results
    ]
    return plain_table(head, body, right=set(range(1, len(head))))


def bench_rocketmq_reads(spark: Any, nameserver: str, produced: Produced, runs: int) -> list[Any]:
    def source() -> Any:
        return (
            spark.read.format("rocketmq")
            .option("nameserver", nameserver)
            .option("topics", TOPIC_ROOT)
            .load()
        )

    from spark import tables

    check_count(spark, source(), produced.sent, "rocketmq")
    return [
        time_reads(spark, "rocketmq: all columns", source, runs, produced.sent),
        time_reads(
            spark,
            "rocketmq: select(topic, payload)",
            lambda: source().select("topic", "payload"),
            runs,
            produced.sent,
        ),
        time_reads(
            spark, "rocketmq: tables.parse", lambda: tables.parse(source()), runs, produced.sent
        ),
    ]


def bench_embedded_reads(spark: Any, data_dir: Path, written: Produced, runs: int) -> ReadResult:
    def source() -> Any:
        return spark.read.format("rocketmq").load(str(data_dir))

    check_count(spark, source(), written.sent, "embedded")
    return time_reads(spark, "embedded log: all columns", source, runs, written.sent)


# --------------------------------------------------------------------------- end to end


class TableWatcher:
    """Follows one file-sink table: when each Parquet file first became readable and when it
    was first listed in `_spark_metadata`, and the event times of its rows."""

    def __init__(
        self, directory: Path, event_ms: Callable[[pa.Table], list[int]], probe_column: str
    ) -> None:
        self.directory = directory
        self.event_ms = event_ms
        self.probe_column = probe_column
        self.readable_at: dict[str, float] = {}
        self.committed_at: dict[str, float] = {}
        self.rows: dict[str, pa.Table] = {}
        self._logs_read: set[str] = set()

    def poll(self, now: float) -> None:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                name = entry.name
                if name in self.readable_at or not name.endswith(".parquet"):
                    continue
                if name.startswith((".", "_")):
                    continue
                try:  # a file the sink is still writing has no footer yet: try again later
                    table = pq.read_table(entry.path)
                except (OSError, pa.ArrowInvalid):
                    continue
                self.readable_at[name] = now
                column = table.column(self.probe_column)
                self.rows[name] = table.filter(pc.invert(pc.starts_with(column, PROBE_LINE)))
        self._poll_commits(now)

    def _poll_commits(self, now: float) -> None:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory / "_spark_metadata"):
                name = entry.name
                if name in self._logs_read or not re.fullmatch(r"\d+(\.compact)?", name):
                    continue
                try:
                    lines = Path(entry.path).read_text().splitlines()
                except OSError:
                    continue
                self._logs_read.add(name)
                for line in lines[1:]:  # the first line is the log's version, "v1"
                    with contextlib.suppress(ValueError, KeyError):
                        file_name = json.loads(line)["path"].rsplit("/", 1)[-1]
                        self.committed_at.setdefault(file_name, now)

    def row_count(self) -> int:
        return sum(t.num_rows for t in self.rows.values())

    def all_committed(self) -> bool:
        return all(name in self.committed_at for name in self.rows)

    def delays(
        self, after_ms: float = 0.0, offset_s: float = 0.0
    ) -> tuple[list[float], list[float]]:
        """(first readable - event, committed - event) for rows whose event is at/after
        `after_ms`; `offset_s` is added to the event time (a minute's length)."""
        readable, committed = [], []
        for name, table in self.rows.items():
            seen = self.readable_at[name]
            commit = self.committed_at.get(name)
            for ms in self.event_ms(table):
                if ms < after_ms:
                    continue
                event = ms / 1000 + offset_s
                readable.append(seen - event)
                if commit is not None:
                    committed.append(max(commit, seen) - event)
        return readable, committed


def epoch_ms(table: pa.Table, column: str) -> list[int]:
    """A timestamp column (Spark writes INT96: pyarrow reads it as ns) as epoch milliseconds."""
    values = table.column(column).cast(pa.timestamp("ms"), safe=False).cast(pa.int64())
    return [v for v in values.to_pylist() if v is not None]


@dataclass
class StreamJob:
    """`python -m spark.jobs stream` in a session of its own, logging to a file."""

    out: Path
    checkpoint: Path
    log_path: Path
    nameserver: str
    proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "spark.jobs", "stream",
            "--nameserver", self.nameserver,
            "--out", str(self.out), "--checkpoint", str(self.checkpoint),
            "--trigger", str(TRIGGER_S), "--starting-offsets", "latest",
        ]  # fmt: skip

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def planned(self) -> bool:
        """Every query has planned a micro-batch (written an entry under offsets/)."""
        for query in QUERIES:
            offsets = self.checkpoint / query / "offsets"
            if not offsets.is_dir() or not any(p.name.isdigit() for p in offsets.iterdir()):
                return False
        return True

    async def wait_ready(self) -> tuple[float, int]:
        """Send PROBE_DEVICE's messages until every query has planned a batch; (seconds, probes)."""
        assert self.proc is not None
        began = time.monotonic()
        async with RocketMQClient(
            self.nameserver, client_id="spark-bench-probe", producer_group="spark-bench-probe"
        ) as client:
            seq = 0
            while not self.planned():
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the stream job exited with {self.proc.returncode}:\n{tail(self.log_path)}"
                    )
                if time.monotonic() - began > JOB_READY_CAP_S:
                    raise TimeoutError(
                        f"stream job queries not running after {JOB_READY_CAP_S:.0f} s:\n"
                        f"{tail(self.log_path)}"
                    )
                topic, tag, keys, properties, body = to_rocketmq(probe_message(seq), ())
                await client.send(topic, body, tags=tag, keys=keys, properties=properties)
                seq += 1
                await asyncio.sleep(1.0)
        return time.monotonic() - began, seq

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def cpu(self) -> float:
        return session_cpu(self.proc.pid) if self.proc is not None else 0.0

    def stop(self) -> None:
        """SIGINT (the job stops its queries), then SIGKILL whatever is left in its session."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)
            try:
                code = self.proc.wait(JOB_STOP_S)
                log(f"    stream job exited with status {code} after SIGINT")
            except subprocess.TimeoutExpired:
                log(f"    stream job still running {JOB_STOP_S:.0f} s after SIGINT; SIGKILL")
        kill_session(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def probe_message(seq: int) -> Message:
    """A valid telemetry message of PROBE_DEVICE with ts = now."""
    sample = {
        "v": 1, "device": PROBE_DEVICE, "line": PROBE_LINE, "station": "S1", "seq": seq,
        "ts": int(time.time() * 1000), "state": "RUNNING", "good": 0, "bad": 0, "alarms": [],
    }  # fmt: skip
    topic = telemetry.telemetry_topic(PROBE_LINE, PROBE_DEVICE)
    return Message(topic, telemetry.encode(sample), qos=1, key=f"probe-{seq}")


def batch_seconds(checkpoint: Path, since: float) -> list[float]:
    """How long each micro-batch of a query planned at or after `since` (epoch s) took: from
    its offsets/N entry (planned) to its commits/N entry (done)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for done in (checkpoint / "commits").iterdir():
            planned = checkpoint / "offsets" / done.name
            if done.name.isdigit() and planned.exists() and planned.stat().st_mtime >= since:
                out.append(done.stat().st_mtime - planned.stat().st_mtime)
    return out


def batch_table(batches: dict[str, dict[str, Any]]) -> str:
    """Micro-batch durations per query as a plain-text table."""
    head = ["query", "batches", "p50 s", "p95 s", "max s"]
    body = [
        [q, str(s["count"]), *(fmt_s(s[k], 1) for k in ("p50", "p95", "max"))]
        for q, s in batches.items()
    ]
    return plain_table(head, body, right={1, 2, 3, 4})


def simulator_command(port: int, seconds: float) -> list[str]:
    """`python -m spark.simulate` in real time: device clocks = wall clock."""
    return [
        sys.executable, "-m", "spark.simulate", "--port", str(port),
        "--time-scale", "1", "--interval", str(SIM_INTERVAL_S),
        "--lines", str(SIM_LINES), "--devices-per-line", str(SIM_DEVICES_PER_LINE),
        "--rate", str(SIM_RATE), "--duration", f"{seconds:g}",
    ]  # fmt: skip


def run_e2e(mq: LocalRocketMQ, tmp: Path, seconds: float) -> dict[str, Any]:
    """Bridge + stream job + simulator; the delays of the telemetry and line_minute rows."""
    out, ck = tmp / "bi", tmp / "ck"
    bridge = BridgeProcess(
        tmp / "bridge-data", "store=rocketmq", f"rocketmq_namesrv={mq.namesrv_addr}"
    )
    job = StreamJob(out, ck, tmp / "stream-job.log", mq.namesrv_addr)
    result: dict[str, Any] = {"job_command": shlex.join(job.command())}
    logs = {"stream": job.log_path, "bridge": bridge.log_path}
    try:
        bridge.start()
        log(f"    bridge pid {bridge.pid} on 127.0.0.1:{bridge.port} (store=rocketmq)")
        job.start()
        assert job.proc is not None
        log(f"    stream job pid {job.proc.pid}: {result['job_command']}")
        ready_s, probes = asyncio.run(job.wait_ready())
        result["job_start_s"] = ready_s
        result["job_start_cpu_s"] = job.cpu()
        log(
            f"    stream job's four queries running after {ready_s:.1f} s ({probes} probe "
            f"messages of {PROBE_DEVICE}; {result['job_start_cpu_s']:.0f} CPU s so far)"
        )
        result.update(_drive(mq, bridge, job, out, seconds))
        # Spark warns when a micro-batch takes longer than the trigger interval.
        behind = re.findall(r"falling behind.* spent (\d+) milliseconds", job.log_text())
        result["batches_behind"] = len(behind)
        result["slowest_behind_s"] = max((int(ms) for ms in behind), default=0) / 1000
    finally:
        job.stop()
        bridge.stop()
        for name, path in logs.items():
            with contextlib.suppress(OSError):
                shutil.copyfile(path, RESULTS_DIR / f"{RESULT_PREFIX}-{name}.log")
    return result


def _drive(
    mq: LocalRocketMQ, bridge: BridgeProcess, job: StreamJob, out: Path, seconds: float
) -> dict[str, Any]:
    telemetry_rows = TableWatcher(out / "telemetry", lambda t: epoch_ms(t, "ts"), "device")
    minute_rows = TableWatcher(out / "line_minute", lambda t: epoch_ms(t, "minute"), "line")
    cmd = simulator_command(bridge.port, seconds)
    sim_log = job.log_path.parent / "simulate.log"
    roles: dict[str, Callable[[], float | None]] = {
        "stream job": job.cpu,
        "bridge": lambda: session_cpu(bridge.pid),
        "rocketmq broker": lambda: proc_cpu(mq.pid("broker")),
        "namesrv": lambda: proc_cpu(mq.pid("namesrv")),
        "machine": machine_busy_s,
    }
    cpu0 = {k: f() for k, f in roles.items()}
    sim_cpu0 = children_cpu()
    load_start = loadavg()
    began_wall = time.time()
    began = time.monotonic()
    log(f"    simulator: {shlex.join(cmd)}")
    with open(sim_log, "wb") as sim_out:
        sim = subprocess.Popen(
            cmd, cwd=REPO, stdout=sim_out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        sim_deadline = began + seconds + 90
        while sim.poll() is None and time.monotonic() < sim_deadline:
            now = time.time()
            telemetry_rows.poll(now)
            minute_rows.poll(now)
            time.sleep(POLL_S)
    finally:
        if sim.poll() is None:
            log("    simulator still running past its cap; SIGKILL")
            kill_session(sim.pid)
        sim.wait(10)
    sim_cpu = children_cpu() - sim_cpu0
    sim_text = sim_log.read_text(errors="replace")
    summary = [line for line in sim_text.splitlines() if "done in" in line]
    acked_match = re.search(r"acked (\d+)", summary[-1]) if summary else None
    acked = int(acked_match.group(1)) if acked_match else None
    # The last rows need up to a trigger and a micro-batch more: wait for them (bounded).
    tail_deadline = time.monotonic() + 3 * TRIGGER_S + 30
    while time.monotonic() < tail_deadline and job.proc is not None and job.proc.poll() is None:
        now = time.time()
        telemetry_rows.poll(now)
        minute_rows.poll(now)
        caught_up = acked is not None and telemetry_rows.row_count() >= acked
        if caught_up and telemetry_rows.all_committed():
            break
        time.sleep(POLL_S)
    cpu1 = {k: f() for k, f in roles.items()}
    window = time.monotonic() - began
    cpu = {
        k: (cpu1[k] - cpu0[k]) if cpu1[k] is not None and cpu0[k] is not None else None
        for k in roles
    }
    cpu["simulator"] = sim_cpu
    if job.proc is not None and job.proc.poll() is not None:
        log(f"    WARNING: the stream job exited ({job.proc.returncode}):\n{tail(job.log_path)}")

    warm_ms = (began_wall + WARMUP_S) * 1000
    all_readable, all_committed = telemetry_rows.delays()
    warm_readable, warm_committed = telemetry_rows.delays(after_ms=warm_ms)
    minute_readable, minute_committed = minute_rows.delays(offset_s=60.0)
    keys = set()
    first_seq: dict[str, int] = {}
    for table in telemetry_rows.rows.values():
        pairs = zip(
            table.column("device").to_pylist(), table.column("seq").to_pylist(), strict=True
        )
        for device, seq in pairs:
            keys.add((device, seq))
            first_seq[device] = min(seq, first_seq.get(device, seq))
    ingest = []
    for table in telemetry_rows.rows.values():
        for ts, stored in zip(epoch_ms(table, "ts"), epoch_ms(table, "store_time"), strict=False):
            ingest.append((stored - ts) / 1000)
    return {
        "simulator_command": shlex.join(cmd),
        "simulator_summary": summary[-1] if summary else tail(sim_log, 5),
        "acked": acked,
        "window_s": window,
        "load_start": load_start,
        "load_end": loadavg(),
        "telemetry_rows": telemetry_rows.row_count(),
        "telemetry_distinct": len(keys),
        "telemetry_files": len(telemetry_rows.rows),
        # Messages of the simulator's devices missing before each device's first row (seq 0 on).
        "missing_at_start": sum(first_seq.values()),
        "devices_seen": len(first_seq),
        "delays": {
            "telemetry, file readable": delay_stats(all_readable),
            "telemetry, committed": delay_stats(all_committed),
            f"telemetry, file readable, ts >= start + {WARMUP_S:.0f} s": delay_stats(warm_readable),
            f"telemetry, committed, ts >= start + {WARMUP_S:.0f} s": delay_stats(warm_committed),
            "line_minute, file readable (from minute end)": delay_stats(minute_readable),
            "line_minute, committed (from minute end)": delay_stats(minute_committed),
        },
        "ingest": delay_stats(ingest),
        "cpu_s": cpu,
        "batches": {q: delay_stats(batch_seconds(job.checkpoint / q, began_wall)) for q in QUERIES},
    }


def delay_table(delays: dict[str, dict[str, Any]]) -> str:
    """The end-to-end delays as a plain-text table."""
    head = ["rows", "count", "p50 s", "p95 s", "p99 s", "max s", f"≤ {GOAL_S:.0f} s"]
    body = [
        [
            name,
            str(s["count"]),
            *(fmt_s(s[k]) for k in ("p50", "p95", "p99", "max")),
            "—" if s["within"] is None else f"{100 * s['within']:.1f}%",
        ]
        for name, s in delays.items()
    ]
    return plain_table(head, body, right=set(range(1, len(head))))


def cpu_table(cpu: dict[str, float | None], window: float) -> str:
    """CPU seconds per process over the end-to-end window, and as % of one core."""
    head = ["process", "CPU s", "% of one core"]
    body = [
        [name, fmt_s(v, 1), "—" if v is None else f"{100 * v / window:.0f}%"]
        for name, v in cpu.items()
    ]
    return plain_table(head, body, right={1, 2})


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=200_000, help="messages to read (200,000)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of every read (3)")
    ap.add_argument(
        "--e2e-seconds",
        type=float,
        default=240.0,
        help="seconds the simulator publishes in the end-to-end run (240: line_minute rows "
        "need about 190 s before the first can appear)",
    )
    ap.add_argument("--skip-e2e", action="store_true", help="only the batch reads")
    ap.add_argument("--skip-read", action="store_true", help="only the end-to-end run")
    ap.add_argument(
        "--rocketmq-java-opts",
        default=DEFAULT_ROCKETMQ_JAVA_OPTS,
        help="ROCKETMQ_JAVA_OPTS for the RocketMQ JVMs (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    if args.messages < 1 or args.runs < 1 or args.e2e_seconds <= 0:
        ap.error("--messages and --runs must be at least 1, --e2e-seconds positive")
    if args.skip_e2e and args.skip_read:
        ap.error("--skip-e2e and --skip-read together leave nothing to run")
    return args


def main(argv: list[str] | None = None) -> int:
    command = shlex.join([sys.executable, *(sys.argv if argv is None else [__file__, *argv])])
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    os.environ["ROCKETMQ_JAVA_OPTS"] = args.rocketmq_java_opts  # read by LocalRocketMQ._env()
    meta: dict[str, Any] = {
        "command": command,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "loadavg_start": loadavg(),
        "rocketmq_java_opts": args.rocketmq_java_opts,
    }
    log(f"command: {command}")
    log(f"cpus:    {meta['cpus']} (nproc), load average {meta['loadavg_start']} at the start")
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    mq = LocalRocketMQ(tmp / "rocketmq", flush_disk_type="SYNC_FLUSH")
    spark = None
    results: dict[str, Any] = {}
    failed = False
    try:
        log(f"\n=== RocketMQ 5.3.3 (namesrv {mq.namesrv_addr}, SYNC_FLUSH) ...")
        began = time.monotonic()
        mq.start()
        asyncio.run(create_topic(mq.namesrv_addr))
        log(
            f"    started in {time.monotonic() - began:.1f} s; topic {TOPIC_ROOT!r}, "
            f"{QUEUES} queues"
        )
        if not args.skip_read:
            from spark.session import spark_session

            log(f"\n=== producing {args.messages:,} telemetry messages into RocketMQ "
                f"(RocketMQClient.send, {SEND_WINDOW} in flight)")  # fmt: skip
            produced = asyncio.run(produce(mq.namesrv_addr, args.messages))
            log(
                f"    sent {produced.sent:,} ({produced.failed} failed) in "
                f"{produced.seconds:.1f} s: {produced.rate:,.0f} msg/s, payload "
                f"{produced.payload_bytes / max(1, produced.sent):.0f} B on average"
            )
            for error in produced.errors:
                log(f"    {error}")
            failed |= produced.failed > 0
            log(f"\n=== writing {args.messages:,} messages with FileLogStore (bridge defaults)")
            data_dir = tmp / "embedded"
            written = asyncio.run(write_log(data_dir, args.messages))
            log(f"    wrote {written.sent:,} in {written.seconds:.1f} s: {written.rate:,.0f} msg/s")
            log(f"\n=== Spark batch reads (local[2]), load average {loadavg()}")
            spark = spark_session("spark-bench", conf={"spark.ui.showConsoleProgress": "false"})
            reads = bench_rocketmq_reads(spark, mq.namesrv_addr, produced, args.runs)
            reads.append(bench_embedded_reads(spark, data_dir, written, args.runs))
            results["produce"] = vars(produced) | {"rate": produced.rate}
            results["filelog_write"] = vars(written) | {"rate": written.rate}
            results["reads"] = [vars(r) | {"median_rate": r.median_rate()} for r in reads]
            failed |= any(s is None for r in reads for s in r.seconds)
            spark.stop()
            spark = None
        if not args.skip_e2e:
            log(f"\n=== end to end: bridge + spark.jobs stream (trigger {TRIGGER_S} s) + "
                f"simulator for {args.e2e_seconds:g} s, load average {loadavg()}")  # fmt: skip
            results["e2e"] = run_e2e(mq, tmp, args.e2e_seconds)
    except (RuntimeError, OSError, TimeoutError) as exc:
        log(f"ERROR: {exc}")
        results["error"] = str(exc)
        failed = True
    finally:
        if spark is not None:
            spark.stop()
        pids = [mq.pid(role) for role in ("broker", "namesrv")]
        try:
            mq.stop(graceful=False)
        except (RuntimeError, OSError) as exc:
            log(f"RocketMQ stop.sh failed ({exc}); killing by PID")
        for pid in pids:
            if pid is not None and is_rocketmq_jvm(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    meta["loadavg_end"] = loadavg()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    report(meta, results)
    return 1 if failed else 0


def report(meta: dict[str, Any], results: dict[str, Any]) -> None:
    """Print the tables and the summary block; write spark-bench.{json,md}."""
    md = [
        f"Spark benchmark (tests/bench/spark_bench.py) {meta['started_at']}, {meta['cpus']} "
        f"CPUs shared with other work, load average {meta['loadavg_start']} at the start and "
        f"{meta['loadavg_end']} at the end.",
        "",
        f"- command: `{meta['command']}`",
        "- no ratio: Mosquitto has no counterpart of a Spark source",
    ]
    if "reads" in results:
        p, w = results["produce"], results["filelog_write"]
        reads = [
            ReadResult(r["name"], r["partitions"], r["seconds"], r["rows"])
            for r in results["reads"]
        ]
        table = read_table(reads)
        log("\nbatch reads into the noop sink (msg/s; run 1 follows a count() warm-up):")
        log(table)
        md += [
            f"- produced {p['sent']:,} telemetry messages into RocketMQ at {p['rate']:,.0f} msg/s "
            f"({SEND_WINDOW} sends in flight, one client); FileLogStore wrote them at "
            f"{w['rate']:,.0f} msg/s; payloads {p['payload_bytes'] / max(1, p['sent']):.0f} B "
            "on average (spark.telemetry.Device)",
            "",
            "```",
            table,
            "```",
        ]
    if "e2e" in results:
        e = results["e2e"]
        log(f"\nend to end (device publish -> row in the table), {e['window_s']:.0f} s window:")
        log(f"    simulator: {e['simulator_summary']}")
        log(
            f"    telemetry: {e['telemetry_rows']:,} rows ({e['telemetry_distinct']:,} distinct "
            f"device/seq) in {e['telemetry_files']} files from {e['devices_seen']} devices; "
            f"acked by the bridge: {e['acked']}; missing before a device's first row: "
            f"{e['missing_at_start']}"
        )
        delays = delay_table(e["delays"])
        log(delays)
        log(
            f"    micro-batches longer than the {TRIGGER_S} s trigger (Spark's 'falling behind' "
            f"warning, all four queries): {e['batches_behind']}, slowest "
            f"{e['slowest_behind_s']:.1f} s"
        )
        batches = batch_table(e["batches"])
        log("micro-batch durations in the window (checkpoint offsets/N -> commits/N):")
        log(batches)
        ingest = e["ingest"]
        log(
            f"    of which publish -> stored in RocketMQ (store_time - ts): p50 "
            f"{fmt_s(ingest['p50'], 3)} s, p95 {fmt_s(ingest['p95'], 3)} s, "
            f"max {fmt_s(ingest['max'], 3)} s"
        )
        log(
            f"    line_minute: a minute is appended only after the watermark ({WATERMARK_S} s of "
            "device time) passes its end, so it lags by design (≈ watermark + trigger)"
        )
        cpu = cpu_table(e["cpu_s"], e["window_s"])
        log(
            "CPU over the window (stream job = driver JVM + Python workers; "
            "machine 200% = both cores):"
        )
        log(cpu)
        log(
            f"    load average {e['load_start']} at the start of the window, "
            f"{e['load_end']} at the end"
        )
        md += [
            "",
            f"End to end: `{e['simulator_command']}` against a bridge (store=rocketmq) and "
            f"`{e['job_command']}` (job start-up {e['job_start_s']:.0f} s); "
            f"{e['telemetry_rows']:,} telemetry rows, load average {e['load_start']} -> "
            f"{e['load_end']}:",
            "",
            "```",
            delays,
            "",
            cpu,
            "",
            batches,
            "```",
            "",
            f"Micro-batches longer than the trigger: {e['batches_behind']} (slowest "
            f"{e['slowest_behind_s']:.1f} s). A line_minute row is appended once the watermark "
            f"({WATERMARK_S} s) passes its minute's end: it lags by design.",
        ]
    if "error" in results:
        md += ["", f"Error: {results['error']}"]
    text = "\n".join(md) + "\n"
    log(f"\ncpus {meta['cpus']}, load average {meta['loadavg_start']} -> {meta['loadavg_end']}, "
        f"total {meta['wall_s']:.0f} s")  # fmt: skip
    log("There is no Mosquitto equivalent of a Spark source, so no ratio is printed.")
    log("\n--- summary for docs/performance.md ---")
    log(text.rstrip())
    (RESULTS_DIR / f"{RESULT_PREFIX}.md").write_text(text)
    doc = {"meta": meta, "results": results}
    (RESULTS_DIR / f"{RESULT_PREFIX}.json").write_text(
        json.dumps(doc, indent=2, default=str) + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
