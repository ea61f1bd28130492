"""`python -m spark.demo`: the factory BI pipeline end to end on this machine, in a few minutes.

    python -m spark.demo --duration 30          # or: make spark-demo DEMO_ARGS="--duration 30"

One line per step, each bounded in time:

1. a RocketMQ (NameServer and broker, `deploy/rocketmq/start.sh`) and a bridge storing into it
   (`store=rocketmq`), on free loopback ports;
2. the streaming BI job (`python -m spark.jobs stream`), a process group of its own;
3. simulated devices (`spark.simulate`) publishing for `--duration` seconds of wall time, their
   clocks sped up to cover `--device-minutes` of factory time;
4. one "clock" message three hours later in device time (line `ZZ`), which moves the stream's
   event-time watermark past every message; then a wait until the stream has written what that
   watermark closes, and the stream is stopped;
5. a back-fill over the same messages (`spark.jobs.run_backfill`) and a comparison of its tables
   with the stream's: the design promises they are equal;
6. the tables (`spark.jobs.show_tables`);
7. good parts and scrap rate per line and minute, drawn into `WORK/throughput.png`.

Everything lives in the work dir (default `./.spark-demo`, wiped at start): RocketMQ's store and
logs, the bridge's data, the logs of the bridge and the stream job, the tables, checkpoints and
the chart. Every process the demo starts is stopped before it exits, on success, on failure and
on Ctrl-C. After a successful run the servers' state (RocketMQ store, bridge data, checkpoints)
is deleted unless `--keep`; tables, logs and the chart stay. Exit status 0, or 1 with a one-line
reason (130 when interrupted).

The servers and processes are in `spark/demo_servers.py`, the clock message of step 4 in
`spark/demo_clock.py`, the Spark half (steps 5 to 7) in `spark/demo_report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from spark import simulate
from spark.demo_clock import CLOCK_AHEAD_MS, CLOCK_LINE, publish_clock
from spark.demo_servers import Child, DemoError, RocketMQ, free_ports, start_bridge

MARKER: Final = ".spark-demo-workdir"
"""File that marks a directory as the demo's own, so `--work-dir` never wipes anything else."""

DEFAULT_WORK_DIR: Final = Path(".spark-demo")
WATERMARK_S: Final = 120
"""The stream job's watermark (its default, passed explicitly so both ends agree)."""
SHIFT_CHANGE: Final = timedelta(hours=14)
"""A shift boundary of the default shifts (06:00, 14:00, 22:00 UTC)."""

STREAM_QUERIES: Final = ("telemetry", "line_minute", "intervals")
"""The queries `python -m spark.jobs stream` runs, each with a checkpoint folder of that name."""
CLOSED_BY_WATERMARK: Final = ("line_minute", "intervals")
"""The queries that write what the watermark closes (a minute, an interval), reading the
`telemetry` table: done once a batch ran with the final watermark. The other, telemetry, reads
the broker and writes what it reads as it reads it (it sorts a row on arrival), and Spark runs
no batch for it when only the watermark moved."""

STREAM_START_TIMEOUT: Final = 240.0
STREAM_RESTARTS: Final = 2


@dataclass(frozen=True, slots=True)
class Options:
    """What the demo runs; the defaults are those of the command line."""

    work_dir: Path = DEFAULT_WORK_DIR
    duration: float = 60.0
    lines: int = 3
    devices_per_line: int = 8
    rate: float | None = None
    device_minutes: float = 40.0
    malformed: float = 0.01
    catch_up_timeout: float = 180.0
    keep: bool = False

    @property
    def time_scale(self) -> float:
        """Device seconds per wall second, so that `duration` covers `device_minutes`."""
        return self.device_minutes * 60 / self.duration

    @property
    def publish_rate(self) -> float:
        """The simulator's ceiling: given, or twice what the devices' periodic samples need (state
        changes add a few more), so the device clocks keep up with the time scale."""
        if self.rate is not None:
            return self.rate
        devices = self.lines * self.devices_per_line
        return math.ceil(2 * devices * self.time_scale / simulate.Options().interval)


class Steps:
    """Prints one line per step, stamped with the seconds since the demo started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)


# --- following the stream job through its checkpoints ------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryCheckpoint:
    """What one streaming query's checkpoint says about its progress. Spark writes each offsets
    and commit file atomically (a hidden temporary file, then a rename), so reading them while
    the job runs is safe."""

    name: str
    planned: int | None
    """The newest batch planned (`offsets/N`), None before the first."""
    committed: int | None
    """The newest batch committed (`commits/N`): its sink has written everything."""
    ran_with_ms: int
    """The event-time watermark the newest committed batch ran with."""
    next_ms: int
    """The watermark the next batch will run with; 0 for a query without event time."""

    @classmethod
    def read(cls, folder: Path) -> QueryCheckpoint:
        def ids(sub: str) -> list[int]:
            return [int(p.name) for p in (folder / sub).glob("[0-9]*") if p.name.isdigit()]

        planned, committed = ids("offsets"), ids("commits")
        if not committed:
            return cls(folder.name, max(planned, default=None), None, 0, 0)
        newest = max(committed)
        # offsets/N: "v1", the batch's metadata, then one line per source.
        metadata = (folder / "offsets" / str(newest)).read_text().splitlines()[1]
        commit = json.loads((folder / "commits" / str(newest)).read_text().splitlines()[1])
        return cls(
            folder.name,
            max(planned),
            newest,
            int(json.loads(metadata).get("batchWatermarkMs", 0)),
            int(commit.get("nextBatchWatermarkMs", 0)),
        )


def read_checkpoints(checkpoints: Path) -> list[QueryCheckpoint]:
    if not checkpoints.is_dir():
        return []
    return [
        QueryCheckpoint.read(folder)
        for folder in sorted(checkpoints.iterdir())
        if (folder / "offsets").is_dir()
    ]


def queries_behind(checkpoints: list[QueryCheckpoint], watermark_ms: int) -> list[str]:
    """The queries that have not yet written everything up to a watermark of `watermark_ms`.

    A query of CLOSED_BY_WATERMARK is done once it committed a batch that ran with that
    watermark (the batch that closes every earlier minute and interval). It read the message
    that moved the watermark there, the last one published, from the `telemetry` table: so the
    telemetry query is done once such a batch exists and it has none in progress."""

    def settled(c: QueryCheckpoint) -> bool:
        return c.committed is not None and c.committed == c.planned

    closed = {
        c.name
        for c in checkpoints
        if c.name in CLOSED_BY_WATERMARK and settled(c) and c.ran_with_ms >= watermark_ms
    }
    telemetry_done = bool(closed)  # and settled, below: it wrote what the others read
    return [
        c.name
        for c in checkpoints
        if not (
            c.name in closed if c.name in CLOSED_BY_WATERMARK else telemetry_done and settled(c)
        )
    ]


class StreamJob:
    """`python -m spark.jobs stream` as a child process, followed through its checkpoints (the
    only thing another process tells; hence polling, once a second).

    When the job exits on its own it is restarted from its checkpoints, at most STREAM_RESTARTS
    times, saying so: the design promises a restarted stream still counts every message once,
    and on a loaded machine Spark can fail a query at start (a Python worker that does not
    connect back within Spark's fixed 10 s)."""

    def __init__(self, work: Path, namesrv: str, step: Steps) -> None:
        command = [
            sys.executable, "-m", "spark.jobs", "stream",
            "--nameserver", namesrv,
            "--out", str(work / "tables"),
            "--checkpoint", str(work / "checkpoints"),
            "--trigger", "5",
            "--watermark", str(WATERMARK_S),
        ]  # fmt: skip
        self.child = Child("the streaming job", command, work / "logs" / "stream.log")
        self.checkpoints = work / "checkpoints"
        self.step = step
        self.restarts = 0

    def check(self) -> None:
        """Restart the job if it has exited; a DemoError once the restarts are used up."""
        if self.child.exited() is None:
            return
        if self.restarts >= STREAM_RESTARTS:
            raise self.child.failure("the streaming job exited")
        self.restarts += 1
        self.step(
            f"the streaming job exited ({self.child.reason()}); restarting it from its "
            f"checkpoints ({self.restarts} of {STREAM_RESTARTS})"
        )
        self.child.stop()  # whatever is left of its process group
        self.child.start()

    def batches_done(self) -> str:
        """How many batches each query has committed, for a progress line."""
        return ", ".join(
            f"{c.name} {0 if c.committed is None else c.committed + 1}"
            for c in read_checkpoints(self.checkpoints)
        )

    def wait_started(self, timeout: float) -> None:
        """Until every query has started (written its checkpoint metadata)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            missing = [
                q for q in STREAM_QUERIES if not (self.checkpoints / q / "metadata").exists()
            ]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise self.child.failure(
                    f"the streaming job did not start {', '.join(missing)} within {timeout:.0f} s"
                )
            time.sleep(1.0)

    def wait_caught_up(self, watermark_ms: int, timeout: float) -> None:
        """Until every query has written everything up to a watermark of `watermark_ms`."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            found = read_checkpoints(self.checkpoints)
            behind = queries_behind(found, watermark_ms)
            behind += [q for q in STREAM_QUERIES if q not in {c.name for c in found}]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the streaming job did not catch up within {timeout:.0f} s (behind: "
                    f"{', '.join(behind)}; log {self.child.log_path})"
                )
            time.sleep(1.0)


# --- the work dir ------------------------------------------------------------------------------


def prepare_work_dir(work: Path) -> None:
    """Wipe and recreate `work`, refusing a non-empty directory the demo did not make. A run
    killed before it could clean up may have left its RocketMQ running: stopped first."""
    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            raise DemoError(f"{work} is not empty and not a demo work dir; choose --work-dir")
        if (work / "rocketmq").exists():
            RocketMQ(work / "rocketmq", 0, 0).stop()
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by python -m spark.demo; wiped at its next start\n")


def start_of_data(span_ms: int) -> int:
    """Where the device clocks start: yesterday's 14:00 UTC shift change minus half the span.

    Chosen over "now minus the span" so the run is about a known piece of a factory day: the
    data crosses a shift boundary, so `availability` shows how intervals are cut between two
    shifts, and it lies wholly in the past, like a real back-fill's."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    change = today - timedelta(days=1) + SHIFT_CHANGE
    return int(change.timestamp() * 1000) - span_ms // 2


def _hhmm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


# --- the run -----------------------------------------------------------------------------------


def simulate_devices(
    options: Options, port: int, start_ms: int, stream: StreamJob, step: Steps
) -> simulate.Summary:
    """Run the simulator in this process; a progress line every 10 s, with the batches each
    stream query has committed so far."""
    sim = simulate.Options(
        port=port,
        lines=options.lines,
        devices_per_line=options.devices_per_line,
        rate=options.publish_rate,
        duration=options.duration,
        time_scale=options.time_scale,
        start_ms=start_ms,
        malformed=options.malformed,
    )

    def progress(summary: simulate.Summary) -> None:
        with contextlib.suppress(DemoError):  # raised again once the simulation is over
            stream.check()
        step(
            f"  simulate: {summary.elapsed:.0f} s, sent {summary.sent}, acked {summary.acked}, "
            f"device clock {_hhmm(start_ms + int(summary.device_seconds * 1000))[-5:]}; "
            f"stream batches done: {stream.batches_done()}"
        )

    try:
        return asyncio.run(simulate.run(sim, progress, 10.0))
    except simulate.SimulatorError as exc:
        raise DemoError(f"simulator: {exc}") from None


def run(options: Options, step: Steps) -> int:
    """The whole demo; the exit status. Stops everything it started before it returns or
    raises."""
    # Imported here, not at the top: it loads PySpark and pandas, which the command line, its
    # --help and the usage errors do not need.
    from spark import demo_report

    work = options.work_dir.resolve()
    prepare_work_dir(work)
    step(f"work dir {work} (wiped)")
    taken: set[int] = set()
    namesrv_port = free_ports(taken)
    broker_port = free_ports(taken, (-2, 0, 1))  # the broker binds P-2, P and P+1
    rocketmq = RocketMQ(work / "rocketmq", namesrv_port, broker_port)
    bridge_port = free_ports(taken)
    children: list[Child] = []
    succeeded = False  # only then is the servers' state not needed to find out what went wrong
    try:
        step(f"starting RocketMQ: NameServer {rocketmq.namesrv}, broker port {broker_port}")
        rocketmq.start()
        step("RocketMQ up; starting a bridge with store=rocketmq")
        bridge_log = work / "logs" / "bridge.log"
        children.append(start_bridge(bridge_port, work / "bridge", rocketmq.namesrv, bridge_log))
        step(f"bridge up on 127.0.0.1:{bridge_port}; starting the streaming job")
        stream = StreamJob(work, rocketmq.namesrv, step)
        children.insert(0, stream.child.start())  # stopped first
        # Devices start once the queries run, so the stream sees their messages arrive.
        stream.wait_started(STREAM_START_TIMEOUT)
        step(f"streaming job running {len(STREAM_QUERIES)} queries (log {stream.child.log_path})")

        span_ms = int(options.device_minutes * 60_000)
        start_ms = start_of_data(span_ms)
        step(
            f"simulating {options.lines} lines x {options.devices_per_line} devices for "
            f"{options.duration:g} s: device time {_hhmm(start_ms)} to "
            f"{_hhmm(start_ms + span_ms)[-5:]} UTC (x{options.time_scale:.0f}), at most "
            f"{options.publish_rate:.0f} msg/s, {options.malformed:.0%} malformed"
        )
        summary = simulate_devices(options, bridge_port, start_ms, stream, step)
        step(f"simulator {simulate.format_summary(summary)}")
        if summary.undelivered:
            step(f"warning: {summary.undelivered} messages were not acknowledged by the bridge")

        clock_ms = start_ms + max(span_ms, int(summary.device_seconds * 1000)) + CLOCK_AHEAD_MS
        publish_clock(bridge_port, clock_ms)
        watermark_ms = clock_ms - WATERMARK_S * 1000
        step(
            f"published the clock message (line {CLOCK_LINE}, {_hhmm(clock_ms)}); waiting up to "
            f"{options.catch_up_timeout:.0f} s for the stream to pass watermark "
            f"{_hhmm(watermark_ms)}"
        )
        stream.wait_caught_up(watermark_ms, options.catch_up_timeout)
        step("the stream has caught up; stopping it")
        stream.child.stop()

        if not demo_report.report(work, rocketmq.namesrv, watermark_ms, step):
            raise DemoError("the stream's and the back-fill's tables differ (see above)")
        succeeded = True
        return 0
    finally:
        # A second Ctrl-C must not cut the clean-up short: every step below is bounded.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for child in children:
                child.stop()
            rocketmq.stop()
            step(f"stopped {', '.join([c.name for c in children] + ['RocketMQ'])}")
            if succeeded and not options.keep:
                for name in ("rocketmq", "bridge", "checkpoints"):
                    shutil.rmtree(work / name, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)


# --- command line ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark.demo",
        description="The factory BI pipeline end to end: RocketMQ, a bridge, simulated devices, "
        "the streaming and back-fill jobs, their tables and a chart.",
    )
    add = parser.add_argument
    positive = simulate.number_option(float, 0, open_low=True)
    positive_int = simulate.number_option(int, 0, open_low=True)
    add("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="(default ./.spark-demo; wiped)")
    add("--duration", type=positive, default=60.0, help="seconds of simulation (60)")
    add("--lines", type=positive_int, default=3, help="production lines (3)")
    add("--devices-per-line", type=positive_int, default=8, help="devices per line (8)")
    add(
        "--rate",
        type=positive,
        default=None,
        metavar="MSG/S",
        help="simulator's ceiling (default: twice what the devices need)",
    )
    add(
        "--device-minutes",
        type=positive,
        default=40.0,
        help="factory time the devices cover during --duration (40)",
    )
    add(
        "--catch-up-timeout",
        type=positive,
        default=180.0,
        metavar="SECONDS",
        help="how long the stream may take to write everything after the simulation (180)",
    )
    add(
        "--keep",
        action="store_true",
        help="keep the RocketMQ store, bridge data and checkpoints (servers stop anyway)",
    )
    return parser


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = Options(
        work_dir=args.work_dir,
        duration=args.duration,
        lines=args.lines,
        devices_per_line=args.devices_per_line,
        rate=args.rate,
        device_minutes=args.device_minutes,
        catch_up_timeout=args.catch_up_timeout,
        keep=args.keep,
    )
    signal.signal(signal.SIGTERM, _terminate)
    step = Steps()
    try:
        status = run(options, step)
    except DemoError as exc:
        print(f"spark-demo: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("spark-demo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    step(f"done in {time.monotonic() - step.started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
