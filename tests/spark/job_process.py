"""The BI stream job as a process under test: its checkpoint's commits, waiting on it with its
errors in the failure, and killing it with everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


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
            raise AssertionError(
                f"the stream job exited early ({process.returncode}):\n" + job_errors(log)
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + job_errors(log)
        time.sleep(0.5)


def job_errors(log: Path) -> str:
    """The last error lines of the stream job's log (why a wait for it failed)."""
    errors = [line for line in log.read_text(errors="replace").splitlines()
              if "ERROR" in line or line.startswith(("error:", "Caused by"))]  # fmt: skip
    return "\n".join(errors[-12:])
