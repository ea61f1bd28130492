"""`python -m spark.demo` end to end: its own RocketMQ, bridge, streaming job and Spark, run as
a user would run it, on a small factory. Slow (a few minutes on two cores)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark.job_config import ALL_TABLES

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(960)]

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def running_under(path: Path) -> str:
    """`pgrep -af` lines of processes whose command line mentions `path` (none: empty)."""
    found = subprocess.run(["pgrep", "-af", str(path)], capture_output=True, text=True, check=False)
    return found.stdout.strip()


def kill_listed(lines: str) -> None:
    """SIGKILL every process of `running_under`'s lines, by PID (the demo failed to)."""
    for line in lines.splitlines():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_demo_runs_the_pipeline_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    args = ["--work-dir", str(work), "--duration", "15", "--lines", "2", "--devices-per-line", "2"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "spark.demo", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            # Two minutes on a quiet machine; seven or more beside the other tests' brokers and
            # Spark on two cores, where every micro-batch waits for the CPU.
            timeout=900,
        )
    finally:
        leftovers = running_under(work)
        kill_listed(leftovers)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}:\n{output[-6000:]}"
    assert not leftovers, f"processes left running:\n{leftovers}"

    chart = work / "throughput.png"
    assert chart.read_bytes()[:8] == PNG_MAGIC
    assert chart.stat().st_size > 10_000, "the chart is suspiciously small"
    assert str(chart) in done.stdout
    for name in ALL_TABLES:
        assert f"== {name}:" in done.stdout, f"table {name} not shown"
    assert "stream and back-fill agree on every table" in done.stdout
    assert "Traceback" not in output
