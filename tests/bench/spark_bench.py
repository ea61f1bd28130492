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
   committed: named by a commit of the Delta table's log, ``_delta_log``) minus its ``ts``. The
   issue's goal: ≤ 10 s with a 5 s trigger.

4. Back-fill (``--backfill local|cluster|both``): ``spark.jobs backfill`` over the produced
   messages, every table, ``--runs`` times, in a local session and/or submitted to a standalone
   cluster started by deploy/spark (harness/spark_backfill.py). The issue's target: a back-fill
   of 1 M stored messages at >= 50k msg/s (``--messages 1000000 --skip-read --skip-e2e
   --backfill both``).

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
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
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
from tests.bench.harness.common import RESULTS_DIR, log, on_sigterm
from tests.bench.harness.procfs import (
    loadavg,
)
from tests.bench.harness.rocketmq import add_rocketmq_option, local_rocketmq, stop_rocketmq
from tests.bench.harness.spark import (
    TRIGGER_S,
    ReadResult,
    check_count,
    time_reads,
)
from tests.bench.harness.spark_backfill import (
    BackfillRuns,
    cluster_backfills,
    local_backfills,
    standalone_cluster,
)
from tests.bench.harness.spark_e2e import SIM_DEVICES_PER_LINE, SIM_LINES, run_e2e
from tests.bench.harness.spark_report import report

TOPIC_ROOT = telemetry.TOPIC_PREFIX  # MQTT first level "factory" = RocketMQ topic "factory"
QUEUES = 4  # the broker's defaultTopicQueueNums, stated explicitly
PRODUCER_LINES, PRODUCER_DEVICES_PER_LINE = 4, 10
SEND_WINDOW = 512
PRODUCE_CAP_S = 300.0
WRITE_CAP_S = 300.0
# End to end: the simulator's load (the stream job's settings are in harness/spark.py).
BACKFILL_CONF = {"spark.driver.memory": "3g", "spark.ui.showConsoleProgress": "false"}
"""The local back-fill's session: room for a million cached rows (the default is 1g)."""


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


def run_backfills(
    where: str, nameserver: str, produced: Produced, runs: int, tmp: Path
) -> list[BackfillRuns]:
    """`spark.jobs backfill` over the produced messages: locally, on a cluster, or both."""
    topic_filter = f"{TOPIC_ROOT}/+/+/telemetry"
    done = []
    if where in ("local", "both"):
        from spark.session import spark_session

        log(f"\n=== back-fill of {produced.sent:,} messages in a local session, load average "
            f"{loadavg()}")  # fmt: skip
        spark = spark_session("spark-bench-backfill", conf=BACKFILL_CONF)
        try:
            done.append(local_backfills(spark, nameserver, topic_filter, produced.sent, runs, tmp))
        finally:
            spark.stop()
    if where in ("cluster", "both"):
        log(f"\n=== back-fill of {produced.sent:,} messages on a standalone cluster, load "
            f"average {loadavg()}")  # fmt: skip
        done.append(cluster_backfills(nameserver, topic_filter, produced.sent, runs, tmp))
    for runs_of in done:
        for error in runs_of.errors:
            log(f"    {error}")
    return done


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
    ap.add_argument(
        "--e2e-rate",
        type=int,
        default=SIM_LINES * SIM_DEVICES_PER_LINE,
        help="devices of the end-to-end run, each sending a message a second (200)",
    )
    ap.add_argument(
        "--e2e-cluster",
        action="store_true",
        help="run the end-to-end stream job on a standalone cluster (deploy/spark)",
    )
    ap.add_argument(
        "--backfill",
        choices=("local", "cluster", "both"),
        default=None,
        help="also time `spark.jobs backfill` over the produced messages, --runs times: in a "
        "local session, on a standalone cluster (deploy/spark), or both",
    )
    ap.add_argument("--skip-read", action="store_true", help="only the end-to-end run")
    add_rocketmq_option(ap)
    args = ap.parse_args(argv)
    if args.messages < 1 or args.runs < 1 or args.e2e_seconds <= 0:
        ap.error("--messages and --runs must be at least 1, --e2e-seconds positive")
    if args.skip_e2e and args.skip_read and not args.backfill:
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
        if not args.skip_read or args.backfill:
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
            results["produce"] = vars(produced) | {"rate": produced.rate}
        if args.backfill:
            results["backfills"] = [
                vars(r) | {"median_rate": r.median_rate(), "median_job_rate": r.median_rate(True)}
                for r in run_backfills(args.backfill, mq.namesrv_addr, produced, args.runs, tmp)
            ]
            failed |= any(r["errors"] for r in results["backfills"])
        if not args.skip_read:
            from spark.session import spark_session

            log(f"\n=== writing {args.messages:,} messages with FileLogStore (bridge defaults)")
            data_dir = tmp / "embedded"
            written = asyncio.run(write_log(data_dir, args.messages))
            log(f"    wrote {written.sent:,} in {written.seconds:.1f} s: {written.rate:,.0f} msg/s")
            log(f"\n=== Spark batch reads (local[2]), load average {loadavg()}")
            spark = spark_session("spark-bench", conf={"spark.ui.showConsoleProgress": "false"})
            reads = bench_rocketmq_reads(spark, mq.namesrv_addr, produced, args.runs)
            reads.append(bench_embedded_reads(spark, data_dir, written, args.runs))
            results["filelog_write"] = vars(written) | {"rate": written.rate}
            results["reads"] = [vars(r) | {"median_rate": r.median_rate()} for r in reads]
            failed |= any(s is None for r in reads for s in r.seconds)
            spark.stop()
            spark = None
        if not args.skip_e2e:
            log(f"\n=== end to end: bridge + spark.jobs stream (trigger {TRIGGER_S} s) + "
                f"simulator for {args.e2e_seconds:g} s, load average {loadavg()}")  # fmt: skip
            if args.e2e_cluster:
                with standalone_cluster(tmp) as cluster:
                    results["e2e"] = run_e2e(mq, tmp, args.e2e_seconds, args.e2e_rate, cluster)
            else:
                results["e2e"] = run_e2e(mq, tmp, args.e2e_seconds, args.e2e_rate, None)
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
