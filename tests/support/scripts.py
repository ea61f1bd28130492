"""Run the deploy/ scripts from tests, and read the PID files they write.

Tests start servers through the same scripts operators use, so a broken script fails a test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def in_netns(netns: str | None, script: Path, *args: str) -> list[str]:
    """The command that runs a deploy script with args: in network namespace `netns` (`ip netns
    exec`, root only; what it starts stays there) unless that is None."""
    if netns is None:
        return [str(script), *args]
    return ["ip", "netns", "exec", netns, "bash", str(script), *args]


def run_script(
    script: Path,
    *args: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    netns: str | None = None,
) -> str:
    """Run a deploy script (in network namespace `netns`, if given); return its stdout, or raise
    RuntimeError with everything it printed (the scripts print the server's log tail when a
    start fails)."""
    command = f"{script.relative_to(REPO)} {' '.join(args)}"
    try:
        proc = subprocess.run(
            in_netns(netns, script, *args),
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{command} timed out after {timeout} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"{command} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def running(pid: int, marker: str) -> bool:
    """Whether process pid is alive and its command line contains marker.

    A zombie counts as gone (the init of a container may reap orphans late), and the marker
    guards against a PID recycled since it was recorded.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z" and marker.encode() in cmdline


def recorded_pid(pid_file: Path, marker: str) -> int | None:
    """The PID in pid_file if that process is running (see running); else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if running(pid, marker) else None


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a server's log, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return f"----- {path} -----\n" + "\n".join(text)
