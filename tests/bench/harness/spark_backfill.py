"""The back-fill benchmark: `spark.jobs backfill` (every BI table) over telemetry stored in
RocketMQ, timed as a user runs it: in a local Spark session (`python -m spark.jobs backfill`'s
way, here in the harness's own session) and submitted to a standalone cluster started by
deploy/spark (one worker, its executor in a JVM of its own).

A run's rate is the stored messages over the run's wall time; a cluster run's wall time includes
spark-submit starting the driver and the executor, so the job's own time (the line `back-fill
took N s` the job prints) is given beside it. Every run is capped (`RUN_CAP_S`) and checked: it
must count every stored message in `telemetry`. The cluster is stopped in a `finally`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.harness.common import REPO, log
from tests.support.ports import free_port

DEPLOY = REPO / "deploy" / "spark"
RUN_CAP_S = 900.0
WORKER_CORES, WORKER_MEMORY = "2", "4g"
SUBMIT_OPTS = "--driver-memory 2g --executor-memory 3g"
"""The cluster's job: a driver and one executor with room for a million cached rows."""


@dataclass
class BackfillRuns:
    """The timed back-fills of one place."""

    where: str
    messages: int
    seconds: list[float | None] = field(default_factory=list)
    """Wall time of each run; None when it failed or hit the cap."""
    job_seconds: list[float | None] = field(default_factory=list)
    """The job's own time (cluster runs: without spark-submit's start-up)."""
    errors: list[str] = field(default_factory=list)

    def rates(self, job: bool = False) -> list[float | None]:
        values = self.job_seconds if job else self.seconds
        return [self.messages / s if s else None for s in values]

    def median_rate(self, job: bool = False) -> float | None:
        rates = [r for r in self.rates(job) if r is not None]
        return statistics.median(rates) if rates else None


def local_backfills(
    spark: Any, nameserver: str, topic_filter: str, messages: int, runs: int, work: Path
) -> BackfillRuns:
    """`run_backfill` in this process's local session, `runs` times, each into a fresh folder."""
    from spark.job_config import JobConfig
    from spark.jobs import run_backfill

    result = BackfillRuns(f"local session ({spark.sparkContext.master})", messages)
    for run in range(runs):
        out = work / f"backfill-local-{run}"
        config = JobConfig(out=str(out), nameserver=nameserver, topic_filter=topic_filter)
        began = time.monotonic()
        counts = run_backfill(spark, config, None, None)
        seconds = time.monotonic() - began
        ok = counts["telemetry"] == messages
        if not ok:
            result.errors.append(f"run {run + 1}: telemetry {counts['telemetry']} != {messages}")
        result.seconds.append(seconds if ok else None)
        result.job_seconds.append(seconds if ok else None)
        log(f"    local run {run + 1}: {seconds:.1f} s, {messages / seconds:,.0f} msg/s, {counts}")
        shutil.rmtree(out, ignore_errors=True)
    return result


def cluster_env() -> dict[str, str]:
    """The environment of deploy/spark's scripts for the benchmark's cluster and jobs."""
    return {**os.environ, "SPARK_WORKER_CORES": WORKER_CORES,
            "SPARK_WORKER_MEMORY": WORKER_MEMORY, "SUBMIT_OPTS": SUBMIT_OPTS}  # fmt: skip


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[Path]:
    """A standalone master and one worker (deploy/spark/start.sh); yields its data folder, for
    deploy/spark/submit.sh. Stopped (executors, worker, master) by stop.sh at the end."""
    data, port = work / "spark-standalone", free_port()
    data.mkdir(parents=True, exist_ok=True)
    try:
        started = subprocess.run([DEPLOY / "start.sh", data, str(port), "1"], env=cluster_env(),
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"deploy/spark/start.sh failed: {started.stderr[-800:]}")
        yield data
    finally:
        subprocess.run([DEPLOY / "stop.sh", data], capture_output=True, timeout=120)


def cluster_backfills(
    nameserver: str, topic_filter: str, messages: int, runs: int, work: Path
) -> BackfillRuns:
    """A standalone master and one worker, the back-fill submitted `runs` times through
    deploy/spark/submit.sh; the cluster stopped at the end."""
    env = cluster_env()
    result = BackfillRuns(
        f"standalone cluster (1 worker: {WORKER_CORES} cores, {WORKER_MEMORY})", messages
    )
    with standalone_cluster(work) as data:
        for run in range(runs):
            out = work / f"backfill-cluster-{run}"
            command = [DEPLOY / "submit.sh", data, "backfill", "--nameserver", nameserver,
                       "--topic-filter", topic_filter, "--out", str(out)]  # fmt: skip
            began = time.monotonic()
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True,
                                      timeout=RUN_CAP_S, start_new_session=True)  # fmt: skip
            except subprocess.TimeoutExpired:
                result.errors.append(f"run {run + 1}: over the {RUN_CAP_S:.0f} s cap")
                result.seconds.append(None)
                result.job_seconds.append(None)
                continue
            seconds = time.monotonic() - began
            counted = re.search(r"^telemetry: (\d+) rows$", done.stdout, re.MULTILINE)
            took = re.search(r"^back-fill took ([\d.]+) s$", done.stdout, re.MULTILINE)
            ok = done.returncode == 0 and counted is not None and int(counted[1]) == messages
            if not ok:
                result.errors.append(
                    f"run {run + 1}: exit {done.returncode}, {counted and counted[0]}: "
                    f"{done.stderr[-800:]}"
                )
            result.seconds.append(seconds if ok else None)
            result.job_seconds.append(float(took[1]) if ok and took else None)
            job = f"{float(took[1]):.1f} s in the job" if took else "no job time"
            log(f"    cluster run {run + 1}: {seconds:.1f} s ({job}), exit {done.returncode}")
            shutil.rmtree(out, ignore_errors=True)
    return result
