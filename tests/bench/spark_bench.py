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
   committed: listed in the file sink's ``_spark_metadata`` log, or for ``telemetry``, which
   is written per micro-batch, its ``batch=<id>`` folder finished) minus its ``ts``. The
   issue's goal: ≤ 10 s with a 5 s trigger.

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
import datetime as dt
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.storage import FileLogStore
from bridge.storage.base import Message, future_callback
from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.mapping import rocketmq_topic, to_rocketmq
from spark import telemetry
from spark.simulate import device_names
from tests.bench.harness.common import REPO, RESULTS_DIR, copy_logs, log, on_sigterm, tail
from tests.bench.harness.processes import kill_session
from tests.bench.harness.procfs import (
    CpuWindow,
    children_cpu_s,
    loadavg,
    machine_busy_s,
    proc_cpu,
    session_cpu,
)
from tests.bench.harness.rocketmq import add_rocketmq_option, local_rocketmq, stop_rocketmq
from tests.bench.harness.spark import (
    PROBE_DEVICE,
    QUERIES,
    TRIGGER_S,
    ReadResult,
    StreamJob,
    TableWatcher,
    batch_seconds,
    check_count,
    delay_stats,
    epoch_ms,
    time_reads,
)
from tests.bench.harness.spark_report import RESULT_PREFIX, report
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import LocalRocketMQ

TOPIC_ROOT = telemetry.TOPIC_PREFIX  # MQTT first level "factory" = RocketMQ topic "factory"
QUEUES = 4  # the broker's defaultTopicQueueNums, stated explicitly
PRODUCER_LINES, PRODUCER_DEVICES_PER_LINE = 4, 10
SEND_WINDOW = 512
PRODUCE_CAP_S = 300.0
WRITE_CAP_S = 300.0
# End to end: the simulator's load (the stream job's settings are in harness/spark.py).
SIM_LINES, SIM_DEVICES_PER_LINE, SIM_RATE, SIM_INTERVAL_S = 4, 50, 400, 1
POLL_S = 0.25
WARMUP_S = 20.0
"""Rows published in the first seconds meet Python workers and code paths still starting up;
the delays are printed for every row and again for the rows after this."""


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
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            store.submit(message, (), callback=future_callback(future))
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
    logs = {"stream.log": job.log_path, "bridge.log": bridge.log_path}
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
        copy_logs(logs, RESULTS_DIR, f"{RESULT_PREFIX}-")
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
    usage = CpuWindow(roles)
    sim_cpu0 = children_cpu_s()
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
    sim_cpu = children_cpu_s() - sim_cpu0
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
    usage.close()
    window = time.monotonic() - began
    cpu = {k: usage.used(k) for k in roles}
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
    add_rocketmq_option(ap)
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
    mq = local_rocketmq(tmp / "rocketmq", args.rocketmq_java_opts, "SYNC_FLUSH")
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
        stop_rocketmq(mq)
        shutil.rmtree(tmp, ignore_errors=True)
    meta["loadavg_end"] = loadavg()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    report(meta, results, SEND_WINDOW)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
