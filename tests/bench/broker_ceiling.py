#!/usr/bin/env python3
"""How fast RocketMQ alone stores messages on this machine, and at what CPU cost per message.

The issue asks for >= 15,900 msg/s of QoS 1, 2 KB messages "on this 2-core box with RocketMQ on
it". The gateway reaches a fraction of that, and docs/performance/2026-11-22-through-rocketmq.md
("What limits it") blames part of it on the broker's own CPU (~90 µs per SYNC_FLUSH message).
This script measures the ceiling without the gateway: RocketMQ 5.3.3 exactly as
``deploy/rocketmq`` configures it (``LocalRocketMQ``: one NameServer, one broker, this
repository's broker.conf), driven by RocketMQ's own benchmark producer
(``org.apache.rocketmq.example.benchmark.Producer``) on the official Java client.
Run from the repository root::

    .venv/bin/python tests/bench/broker_ceiling.py [--modes SYNC_FLUSH] [--sizes 2048]
        [--threads 4,64,256,1024] [--keys false,true] [--reports 3]

For every flush mode (``SYNC_FLUSH`` is what the gateway uses; ``ASYNC_FLUSH`` for comparison)
it starts a fresh RocketMQ in a temp dir, creates the topic, times 4 KiB ``fdatasync`` calls on
the store's disk (the unit cost of a group commit), warms the broker's JIT with an unreported
run, measures what the idle broker burns (10 s), then runs the Producer once per (size, keys,
threads): synchronous sends (``-y false``: each thread waits for SEND_OK, with SYNC_FLUSH for
the fsync, so the thread count is the number of sends in flight; all threads share the client's
one connection to the broker, as the gateway pipelines its sends over one connection). The
Producer's asynchronous mode (``-y true``) is not used: it queues sends without a bound, and on
this machine every send of it failed and its JVM ran out of heap. The Producer prints, every
``-ri`` (10 s here), the TPS and average RT of the last 10 one-second snapshots; the first
``--warmup-reports`` reports are the Producer JVM's start and JIT and are not measured, the
next ``--reports`` are. At the first and the last of those reports the script samples:

* CPU (utime + stime, all threads) of the broker, NameServer and Producer JVMs, from
  ``/proc/PID/stat``, and of the broker's threads by name (``/proc/PID/task``); the machine's
  busy, iowait and steal time from ``/proc/stat``, and the rest of the busy time as "others"
  (other people's work on the shared box);
* the broker's ``putMessageTimesTotal`` and ``commitLogMaxOffset`` (GET_BROKER_RUNTIME_INFO,
  one remoting request through deploy/rocketmq/probe.py): messages stored in the window,
  independent of the Producer's rounding;
* the store disk's completed writes and flush requests (``/proc/diskstats``; device-wide, so
  other processes' flushes count too: an upper bound on the broker's group commits).

Per run it reports msg/s stored, the Producer's TPS and average RT, CPU µs per message of
broker and Producer ("marginal": the broker's minus its idle burn, the part that grows with the
rate), and "CPU ceiling": the number of CPUs x 1 s / (broker + NameServer +
Producer CPU per message), the rate at which those processes alone would fill every core of
this machine. That bound, not the measured rate, answers "reachable at all?" on a machine that
other work shares; the measured rate is a lower bound. ``--wait-quiet S`` makes every run wait
(up to S seconds) for a lull in the other work first.

Messages with ``INNER_MULTI_DISPATCH`` (light-queue dispatch, as the gateway sends) cannot be
measured this way: the Producer sets only its own keys (``-k``), tags (``-l``) and generated
"propN" user properties (``-p``), no property of our choosing.

The Producer is not published as a jar for 5.3.x (Maven Central has ``rocketmq-example`` for
4.x and 5.5.0 only), so the first run fetches the official source release
(``org.apache.rocketmq:rocketmq-all:5.3.3:zip:source-release``) with Maven into a cache outside
the repository (default ``~/.cache/mqtt-bridge/rocketmq-benchmark-5.3.3``) and compiles the two
benchmark classes it needs against the jars ``deploy/rocketmq/fetch.sh`` caches.

Prints a table and writes ``tests/bench/results/broker-ceiling-<UTC time>.json`` (every report
line, sample and command line). Bounded: each report must come within a deadline, a time budget
skips the remaining runs, and every process started (Producer by PID, RocketMQ through
``LocalRocketMQ.stop``) is stopped in a ``finally``, also on Ctrl-C and SIGTERM. The logs of a
flush mode with a failure are copied to ``tests/bench/results/broker-ceiling-<time>-logs/``.
Exit status 1 if a run failed or a send failed in a measured window.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.common import RESULTS_DIR, log, on_sigterm
from tests.bench.harness.procfs import (
    CpuWindow,
    disk_counters,
    disk_of,
    loadavg,
    machine_busy_s,
    machine_times,
    proc_cpu,
    thread_groups_cpu,
)
from tests.bench.harness.producer import (
    DEFAULT_PRODUCER_JAVA_OPTS,
    PRODUCER_MAIN,
    SOURCE_ARTIFACT,
    ensure_producer,
    producer_command,
    run_producer,
)
from tests.bench.harness.report import plain_table
from tests.bench.harness.rocketmq import (
    ROCKETMQ_VERSION,
    add_rocketmq_option,
    broker_counters,
)
from tests.support.rocketmq import LocalRocketMQ

TOPIC = "BrokerCeiling"
TOPIC_QUEUES = 4  # broker.conf's defaultTopicQueueNums
IDLE_SECONDS = 10.0
QUIET_PROBE_S = 5.0


# --------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    """Cumulative counters at one instant; a measurement is the difference of two."""

    at: float  # time.monotonic()
    broker_cpu_s: float
    namesrv_cpu_s: float
    producer_cpu_s: float
    machine_busy_s: float  # all CPUs, not idle or iowait (steal included)
    machine_iowait_s: float  # idle with a disk request outstanding (e.g. during an fsync)
    machine_steal_s: float
    puts: int  # broker's putMessageTimesTotal
    commitlog_bytes: int  # broker's commitLogMaxOffset
    disk_writes: int | None
    disk_flushes: int | None
    broker_threads: dict[str, float]  # CPU seconds per thread group, see thread_groups_cpu


def take_sample(mq: LocalRocketMQ, producer_pid: int, device: tuple[int, int]) -> Sample:
    puts, commitlog_bytes = broker_counters(mq)
    busy, iowait, steal = machine_times()
    writes, flushes = disk_counters(device)
    broker_pid = mq.pid("broker")
    return Sample(
        at=time.monotonic(),
        broker_cpu_s=proc_cpu(broker_pid) or 0.0,
        namesrv_cpu_s=proc_cpu(mq.pid("namesrv")) or 0.0,
        producer_cpu_s=proc_cpu(producer_pid) or 0.0,
        machine_busy_s=busy,
        machine_iowait_s=iowait,
        machine_steal_s=steal,
        puts=puts,
        commitlog_bytes=commitlog_bytes,
        disk_writes=writes,
        disk_flushes=flushes,
        broker_threads=thread_groups_cpu(broker_pid),
    )


def fdatasync_latency_ms(directory: Path, count: int = 200, block: int = 4096) -> dict[str, float]:
    """p50/p90/max of one 4 KiB overwrite + fdatasync in a preallocated file next to the store.

    A SYNC_FLUSH group commit is an msync of the preallocated, mapped commit-log file, i.e. a
    data-only sync of the pages written since the last one; this is its cost on this disk at
    the moment, which bounds how many group commits per second the broker can do.
    """
    path = directory / "fdatasync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, bytes(block * count), 0)
        os.fsync(fd)
        data = os.urandom(block)
        times = []
        for i in range(count):
            start = time.perf_counter()
            os.pwrite(fd, data, i * block)
            os.fdatasync(fd)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    times.sort()
    return {
        "p50_ms": round(times[count // 2], 3),
        "p90_ms": round(times[count * 9 // 10], 3),
        "max_ms": round(times[-1], 3),
    }


# --------------------------------------------------------------------------- one run


@dataclass
class RunSpec:
    mode: str
    size: int
    keys: bool
    threads: int


def producer_run(
    mq: LocalRocketMQ,
    cmd: list[str],
    log_path: Path,
    device: tuple[int, int],
    warmup_reports: int,
    reports: int,
    idle_broker_pct: float = 0.0,
) -> dict[str, Any]:
    """Run the Producer until warmup_reports + reports reports, sampling the counters at report
    number warmup_reports and at the last one; the figures of the window between them."""
    parsed, samples = run_producer(
        cmd, log_path, warmup_reports, reports, lambda pid: take_sample(mq, pid, device)
    )
    before = parsed[warmup_reports - 1] if warmup_reports else None
    return summarize(parsed[warmup_reports:], before, samples[0], samples[-1], idle_broker_pct)


def command(
    args: argparse.Namespace, classpath: str, mq: LocalRocketMQ, spec: RunSpec
) -> list[str]:
    """The Producer's command line for one run; its client logs go to the store's dir."""
    return producer_command(
        args.producer_java_opts,
        classpath,
        mq,
        mq.data_dir / "home",
        topic=TOPIC,
        size=spec.size,
        threads=spec.threads,
        keys=spec.keys,
    )


def summarize(
    window: list[dict[str, float]],
    before: dict[str, float] | None,
    s0: Sample,
    s1: Sample,
    idle_broker_pct: float,
) -> dict[str, Any]:
    """Rates and per-message costs between two samples; the Producer's own figures from the
    reports that cover the same window (its failure counters are cumulative, so the last
    warm-up report, `before`, tells the failures of the window from those of the start-up).

    "marginal" broker cost subtracts what the broker burns when idle (idle_broker_pct, % of a
    core: its 1 ms polling loops, timers, JIT): the part that scales with the message rate."""
    seconds = s1.at - s0.at
    msgs = s1.puts - s0.puts
    if msgs <= 0:
        raise RuntimeError("the broker stored no message during the measured window")
    broker = s1.broker_cpu_s - s0.broker_cpu_s
    namesrv = s1.namesrv_cpu_s - s0.namesrv_cpu_s
    producer = s1.producer_cpu_s - s0.producer_cpu_s
    busy = s1.machine_busy_s - s0.machine_busy_s
    ncpu = os.cpu_count() or 1
    result: dict[str, Any] = {
        "seconds": round(seconds, 2),
        "messages": msgs,
        "msg_per_s": round(msgs / seconds),
        "stored_bytes_per_msg": round((s1.commitlog_bytes - s0.commitlog_bytes) / msgs, 1),
        "producer_tps": round(statistics.mean(r["tps"] for r in window)),
        "producer_avg_rt_ms": round(statistics.mean(r["avg_rt"] for r in window), 3),
        "producer_max_rt_ms_since_start": window[-1]["max_rt"],
        "failed_in_window": int(
            window[-1]["send_failed"]
            + window[-1]["response_failed"]
            - (before["send_failed"] + before["response_failed"] if before else 0)
        ),
        "failed_since_start": int(window[-1]["send_failed"] + window[-1]["response_failed"]),
        "broker_us_per_msg": round(broker / msgs * 1e6, 1),
        "broker_marginal_us_per_msg": round(
            (broker - idle_broker_pct / 100 * seconds) / msgs * 1e6, 1
        ),
        "namesrv_us_per_msg": round(namesrv / msgs * 1e6, 2),
        "producer_us_per_msg": round(producer / msgs * 1e6, 1),
        "broker_cpu_pct": round(broker / seconds * 100),
        "producer_cpu_pct": round(producer / seconds * 100),
        "machine_busy_pct": round(busy / seconds * 100),
        "machine_iowait_pct": round((s1.machine_iowait_s - s0.machine_iowait_s) / seconds * 100),
        "machine_steal_pct": round((s1.machine_steal_s - s0.machine_steal_s) / seconds * 100),
        "others_cpu_pct": round((busy - broker - namesrv - producer) / seconds * 100),
        "cpu_ceiling_msg_per_s": round(ncpu * 1e6 / ((broker + namesrv + producer) / msgs * 1e6)),
        "broker_only_ceiling_msg_per_s": round(ncpu * 1e6 / (broker / msgs * 1e6)),
        "broker_threads_us_per_msg": {
            name: round((cpu - s0.broker_threads.get(name, 0.0)) / msgs * 1e6, 1)
            for name, cpu in sorted(
                s1.broker_threads.items(),
                key=lambda item: item[1] - s0.broker_threads.get(item[0], 0.0),
                reverse=True,
            )
            if cpu > s0.broker_threads.get(name, 0.0)
        },
        "samples": [asdict(s0), asdict(s1)],
        "reports": window,
    }
    if s0.disk_flushes is not None and s1.disk_flushes is not None:
        flushes = s1.disk_flushes - s0.disk_flushes
        result["disk_flushes_per_s"] = round(flushes / seconds)
        result["msgs_per_disk_flush"] = round(msgs / flushes, 1) if flushes else None
    if s0.disk_writes is not None and s1.disk_writes is not None:
        result["disk_writes_per_s"] = round((s1.disk_writes - s0.disk_writes) / seconds)
    return result


# --------------------------------------------------------------------------- main


def csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--modes", default="SYNC_FLUSH,ASYNC_FLUSH", help="flushDiskType values")
    p.add_argument("--sizes", default="2048,100", help="message body sizes in bytes (-s)")
    p.add_argument(
        "--threads", default="4,64,256,1024", help="Producer synchronous send threads (-w)"
    )
    p.add_argument(
        "--keys", default="false", help="Producer -k values: true sets a key the broker indexes"
    )
    p.add_argument(
        "--warmup-reports",
        type=int,
        default=1,
        help="Producer reports (10 s each) before the measured window (default: %(default)s)",
    )
    p.add_argument(
        "--reports", type=int, default=3, help="reports measured per run (default: %(default)s)"
    )
    p.add_argument(
        "--broker-warmup-reports",
        type=int,
        default=3,
        help="length of the unreported run (16 threads, first size) that warms the broker's JIT "
        "after each start, in reports; 0: none (default: %(default)s)",
    )
    add_rocketmq_option(p)
    p.add_argument("--producer-java-opts", default=DEFAULT_PRODUCER_JAVA_OPTS)
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run wait up to S seconds for other processes to use less than "
        "--quiet-pct of a core for 5 s (default: no wait)",
    )
    p.add_argument("--quiet-pct", type=float, default=20.0)
    p.add_argument(
        "--budget",
        type=float,
        default=1800.0,
        help="seconds after which remaining runs are skipped (default: %(default)s)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "mqtt-bridge"
        / f"rocketmq-benchmark-{ROCKETMQ_VERSION}",
    )
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--keep-data", action="store_true", help="keep the temp dir (store, logs)")
    args = p.parse_args(argv)
    args.modes = csv(args.modes)
    for mode in args.modes:
        if mode not in ("SYNC_FLUSH", "ASYNC_FLUSH"):
            p.error(f"--modes: {mode!r} is not SYNC_FLUSH or ASYNC_FLUSH")
    args.sizes = [int(v) for v in csv(args.sizes)]
    args.threads = [int(v) for v in csv(args.threads)]
    args.keys = [v.lower() == "true" for v in csv(args.keys)]
    if args.reports < 1 or args.warmup_reports < 0 or args.broker_warmup_reports < 0:
        p.error("--reports must be >= 1, the warm-ups >= 0")
    return args


def wait_for_quiet(mq: LocalRocketMQ, limit_s: float, others_max_pct: float) -> float | None:
    """Wait up to limit_s for a 5-second stretch in which the rest of the machine (busy time
    minus our broker and NameServer) used less than others_max_pct of a core; return that
    share, or None when the machine stayed busy. Other people's work on the shared cores takes
    CPU from the broker and client and lowers the measured rate, so runs can wait for a lull."""
    deadline = time.monotonic() + limit_s

    def ours() -> float:
        return (proc_cpu(mq.pid("broker")) or 0.0) + (proc_cpu(mq.pid("namesrv")) or 0.0)

    while True:
        window = CpuWindow({"ours": ours, "busy": machine_busy_s})
        time.sleep(QUIET_PROBE_S)
        window.close()
        others = window.percent((window.used("busy") or 0.0) - (window.used("ours") or 0.0))
        if others < others_max_pct:
            return round(others, 1)
        if time.monotonic() + QUIET_PROBE_S > deadline:
            return None


def idle_cpu_pct(mq: LocalRocketMQ, seconds: float) -> float:
    """CPU the broker JVM burns with no client, % of a core, over `seconds`."""
    pid = mq.pid("broker")
    window = CpuWindow({"broker": lambda: proc_cpu(pid) or 0.0})
    time.sleep(seconds)
    return round(window.close().percent(window.used("broker") or 0.0), 1)


def bench_mode(
    mode: str, args: argparse.Namespace, classpath: str, workdir: Path, deadline: float
) -> dict[str, Any]:
    """Start a RocketMQ with this flush mode, run every spec, stop it. The logs of a mode with
    a failure (a run, or a send in a measured window) are copied to the results dir, since the
    temp dir is deleted."""
    mq = LocalRocketMQ(workdir / mode.lower(), flush_disk_type=mode)
    out: dict[str, Any] = {"mode": mode, "runs": [], "errors": []}
    try:
        started = time.monotonic()
        mq.start()
        out["start_s"] = round(time.monotonic() - started, 1)
        mq.create_topic(TOPIC, queues=TOPIC_QUEUES)
        device = disk_of(mq.data_dir)
        out["fdatasync_4k_before"] = fdatasync_latency_ms(mq.data_dir)
        log(
            f"{mode}: RocketMQ up in {out['start_s']} s ({mq.namesrv_addr}, {mq.broker_addr}); "
            f"fdatasync 4 KiB {out['fdatasync_4k_before']}"
        )
        if args.broker_warmup_reports:
            spec = RunSpec(mode, args.sizes[0], False, 16)
            cmd = command(args, classpath, mq, spec)
            log(f"{mode}: warming the broker up ({args.broker_warmup_reports} reports)")
            warmup_log = mq.log_dir / "producer-warmup.out"
            producer_run(mq, cmd, warmup_log, device, args.broker_warmup_reports - 1, 1)
        out["broker_idle_cpu_pct"] = idle_cpu_pct(mq, IDLE_SECONDS)
        log(f"{mode}: idle broker: {out['broker_idle_cpu_pct']}% of a core")
        for size, keys, threads in itertools.product(args.sizes, args.keys, args.threads):
            spec = RunSpec(mode, size, keys, threads)
            if time.monotonic() > deadline:
                out["errors"].append(f"skipped (budget): {spec}")
                continue
            cmd = command(args, classpath, mq, spec)
            run_log = mq.log_dir / f"producer-{size}B-keys{int(keys)}-w{threads}.out"
            if args.wait_quiet:
                waiting_since = time.monotonic()
                quiet = wait_for_quiet(mq, args.wait_quiet, args.quiet_pct)
                log(
                    f"  waited {time.monotonic() - waiting_since:.0f} s for a lull: others "
                    + ("stayed busy" if quiet is None else f"at {quiet}% of a core")
                )
            load_before = loadavg()
            try:
                result = producer_run(
                    mq,
                    cmd,
                    run_log,
                    device,
                    args.warmup_reports,
                    args.reports,
                    out["broker_idle_cpu_pct"],
                )
            except RuntimeError as exc:
                out["errors"].append(f"{spec}: {exc}")
                log(f"  {spec}: FAILED: {exc}")
                continue
            result.update(asdict(spec), command=shlex.join(cmd), loadavg_before=load_before)
            if args.wait_quiet:
                result["others_cpu_pct_before"] = quiet
            result["loadavg_after"] = loadavg()
            out["runs"].append(result)
            log(
                f"  {mode} {size} B keys={keys} w={threads}: {result['msg_per_s']} msg/s, "
                f"RT {result['producer_avg_rt_ms']} ms, broker {result['broker_us_per_msg']} "
                f"µs/msg, producer {result['producer_us_per_msg']} µs/msg, others "
                f"{result['others_cpu_pct']}% of a core (load {result['loadavg_after']})"
            )
            top = list(result["broker_threads_us_per_msg"].items())[:6]
            log("    broker threads, µs/msg: " + ", ".join(f"{n} {us}" for n, us in top))
        out["fdatasync_4k_after"] = fdatasync_latency_ms(mq.data_dir)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        # The broker is gone or unreachable (a failed run alone is caught above): stop this mode.
        out["errors"].append(f"{mode}: {exc}")
        log(f"{mode}: FAILED: {exc}")
    finally:
        mq.stop(graceful=False)
    if out["errors"] or any(r["failed_in_window"] for r in out["runs"]):
        kept = args.results_dir / f"{args.result_name}-logs" / mode.lower()
        shutil.copytree(mq.log_dir, kept, dirs_exist_ok=True)
        out["logs"] = str(kept)
    return out


COLUMNS = [
    ("mode", "flush"),
    ("size", "size B"),
    ("keys", "keys"),
    ("threads", "threads"),
    ("msg_per_s", "msg/s"),
    ("producer_tps", "Producer TPS"),
    ("producer_avg_rt_ms", "avg RT ms"),
    ("broker_us_per_msg", "broker µs/msg"),
    ("broker_marginal_us_per_msg", "marginal"),
    ("producer_us_per_msg", "producer µs/msg"),
    ("broker_cpu_pct", "broker %core"),
    ("producer_cpu_pct", "producer %core"),
    ("others_cpu_pct", "others %core"),
    ("machine_busy_pct", "busy %"),
    ("machine_iowait_pct", "iowait %"),
    ("disk_flushes_per_s", "disk flushes/s"),
    ("msgs_per_disk_flush", "msgs/flush"),
    ("cpu_ceiling_msg_per_s", "CPU ceiling msg/s"),
]


def cell(key: str, value: Any) -> str:
    """Thousands separators for counts and rates; sizes, flags and ratios as they are."""
    if isinstance(value, int) and not isinstance(value, bool) and key != "size":
        return f"{value:,}"
    return "-" if value is None else str(value)


def table(runs: list[dict[str, Any]]) -> str:
    body = [[cell(key, r.get(key)) for key, _ in COLUMNS] for r in runs]
    return plain_table([head for _, head in COLUMNS], body, right=set(range(1, len(COLUMNS))))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    started = dt.datetime.now(dt.UTC)
    args.result_name = f"broker-ceiling-{started:%Y%m%d-%H%M%S}"
    deadline = time.monotonic() + args.budget
    os.environ["ROCKETMQ_JAVA_OPTS"] = args.rocketmq_java_opts  # read by LocalRocketMQ._env()
    report: dict[str, Any] = {
        "started_utc": started.isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "rocketmq_version": ROCKETMQ_VERSION,
        "producer": f"{PRODUCER_MAIN} from {SOURCE_ARTIFACT}",
        "rocketmq_java_opts": args.rocketmq_java_opts,
        "producer_java_opts": args.producer_java_opts,
        "cpus": os.cpu_count(),
        "uptime_at_start": subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "modes": [],
    }
    log(f"load: {report['uptime_at_start']}")
    classpath = ensure_producer(args.cache_dir)
    workdir = Path(tempfile.mkdtemp(prefix="broker-ceiling-"))
    try:
        for mode in args.modes:
            report["modes"].append(bench_mode(mode, args, classpath, workdir, deadline))
    finally:
        if args.keep_data:
            log(f"data kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["loadavg_at_end"] = loadavg()
    runs = [run for m in report["modes"] for run in m["runs"]]
    errors = [e for m in report["modes"] for e in m["errors"]]
    errors += [
        f"{r['mode']} {r['size']} B w={r['threads']}: {r['failed_in_window']} sends failed"
        for r in runs
        if r["failed_in_window"]
    ]
    # Failures before the window do not touch the figures, but are shown: with hundreds of
    # threads, some of the cold Producer's first sends time out (3 s, the client's default).
    notes = [
        f"{r['mode']} {r['size']} B w={r['threads']}: {r['failed_since_start']} sends failed "
        "before the measured window"
        for r in runs
        if r["failed_since_start"] and not r["failed_in_window"]
    ]
    report["errors"], report["notes"] = errors, notes
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{args.result_name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    log("")
    log(table(runs) if runs else "no run completed")
    for m in report["modes"]:
        log(
            f"{m['mode']}: idle broker {m.get('broker_idle_cpu_pct')}% of a core; fdatasync "
            f"4 KiB before {m.get('fdatasync_4k_before')}, after {m.get('fdatasync_4k_after')}"
        )
    for note in notes:
        log(f"note: {note}")
    log(f"load at start: {report['uptime_at_start']}; at end: {report['loadavg_at_end']}")
    for e in errors:
        log(f"ERROR: {e}")
    log(f"results: {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
