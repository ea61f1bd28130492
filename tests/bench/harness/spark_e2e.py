"""The Spark benchmark's end-to-end run: a bridge on RocketMQ, `spark.jobs stream` (local, or
submitted to a standalone cluster), and `python -m spark.simulate` in real time; a row's delay
is when its file appears in a BI table minus its device time (tests/bench/spark_bench.py says
how each figure is taken)."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.harness.common import REPO, RESULTS_DIR, copy_logs, log, tail
from tests.bench.harness.processes import kill_session
from tests.bench.harness.procfs import (
    CpuWindow,
    children_cpu_s,
    loadavg,
    machine_busy_s,
    proc_cpu,
    session_cpu,
)
from tests.bench.harness.spark import (
    PROBE_DEVICE,
    QUERIES,
    TRIGGER_S,
    StreamJob,
    TableWatcher,
    batch_seconds,
    delay_stats,
    epoch_ms,
)
from tests.bench.harness.spark_backfill import cluster_env
from tests.bench.harness.spark_report import RESULT_PREFIX
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import LocalRocketMQ

SIM_LINES, SIM_DEVICES_PER_LINE, SIM_INTERVAL_S = 4, 50, 1
POLL_S = 0.25
WARMUP_S = 20.0
"""Rows published in the first seconds meet Python workers and code paths still starting up;
the delays are printed for every row and again for the rows after this."""


def simulator_command(port: int, seconds: float, rate: int) -> list[str]:
    """`python -m spark.simulate` in real time: device clocks = wall clock; `rate` devices (one
    message a second each; 200 unless --e2e-rate says), at most twice that many msg/s."""
    per_line = max(1, -(-rate // SIM_LINES))
    return [
        sys.executable, "-m", "spark.simulate", "--port", str(port),
        "--time-scale", "1", "--interval", str(SIM_INTERVAL_S),
        "--lines", str(SIM_LINES), "--devices-per-line", str(per_line),
        "--rate", str(2 * SIM_LINES * per_line), "--duration", f"{seconds:g}",
    ]  # fmt: skip


def run_e2e(
    mq: LocalRocketMQ, tmp: Path, seconds: float, rate: int, cluster: Path | None
) -> dict[str, Any]:
    """Bridge + stream job (local, or on `cluster`) + simulator; the delays of the telemetry
    and line_minute rows."""
    out, ck = tmp / "bi", tmp / "ck"
    bridge = BridgeProcess(
        tmp / "bridge-data", "store=rocketmq", f"rocketmq_namesrv={mq.namesrv_addr}"
    )
    job = StreamJob(out, ck, tmp / "stream-job.log", mq.namesrv_addr, cluster=cluster,
                    env=cluster_env() if cluster else None)  # fmt: skip
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
            f"    stream job's queries running after {ready_s:.1f} s ({probes} probe "
            f"messages of {PROBE_DEVICE}; {result['job_start_cpu_s']:.0f} CPU s so far)"
        )
        result.update(_drive(mq, bridge, job, out, seconds, rate))
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
    mq: LocalRocketMQ, bridge: BridgeProcess, job: StreamJob, out: Path, seconds: float, rate: int
) -> dict[str, Any]:
    telemetry_rows = TableWatcher(out / "telemetry", lambda t: epoch_ms(t, "ts"), "device")
    minute_rows = TableWatcher(out / "line_minute", lambda t: epoch_ms(t, "minute"), "line")
    cmd = simulator_command(bridge.port, seconds, rate)
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
