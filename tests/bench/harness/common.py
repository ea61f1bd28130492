"""What every bench script shares that is neither a process, a /proc reading nor a table: where
things are, logging, small subprocess and text helpers, SIGTERM handling, the run's metadata,
the time budget of a scenario list and keeping logs next to the results."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO = BENCH_DIR.parent.parent
RESULTS_DIR = BENCH_DIR / "results"
HOST = "127.0.0.1"
MOSQUITTO_BIN = "/usr/sbin/mosquitto"


def log(msg: str) -> None:
    """Print a progress line at once (the output is often piped into a log file)."""
    print(msg, flush=True)


def run_text(cmd: list[str], timeout: float = 30.0) -> str:
    """What a short command prints (stdout, else stderr), or why it could not run."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    return (p.stdout or p.stderr).strip()


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def tail(path: Path, n: int = 30) -> str:
    """The last `n` lines of a log, for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) if lines else "(log empty)"


def free_port() -> int:
    """A TCP port on HOST that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def venv_python() -> str:
    """The repository's .venv Python, else the one running this script."""
    python = REPO / ".venv" / "bin" / "python"
    return str(python if python.exists() else sys.executable)


def on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C, so every `finally` stops the
    brokers and RocketMQ instead of leaving them running; a second SIGTERM is ignored so that
    it cannot interrupt that clean-up."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log("SIGTERM: stopping the brokers")
    sys.exit(128 + signum)


def invocation(script: str, argv: list[str] | None) -> tuple[list[str], str]:
    """The arguments to parse and the command line to record: sys.argv as the script was run,
    or `script` with `argv` when main() is called with arguments."""
    if argv is None:
        return sys.argv[1:], shlex.join([sys.executable, *sys.argv])
    return argv, shlex.join([sys.executable, script, *argv])


def begin(
    script: str, argv: list[str] | None, parse: Callable[[list[str]], Any]
) -> tuple[Any, str, float]:
    """The start every bench script's main() shares: its parsed arguments, the command line to
    record, SIGTERM turned into a clean stop (`on_sigterm`) and the start time."""
    argv, command = invocation(script, argv)
    args = parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    return args, command, time.monotonic()


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def platform_name() -> str:
    return f"{platform.system()} {platform.release()} {platform.machine()}"


def tool_versions(python_path: bool = True) -> dict[str, str]:
    """Mosquitto's, Go's and Python's versions for the results (`python_path`: with the
    interpreter's path)."""
    python = platform.python_version()
    return {
        "mosquitto": first_line(run_text([MOSQUITTO_BIN, "-h"])),
        "go": run_text(["go", "version"]),
        "python": (python + f" ({sys.executable})") if python_path else python,
    }


def copy_logs(logs: Mapping[str, Path | str], dest_dir: Path, prefix: str = "") -> None:
    """Copy every log that exists to dest_dir as prefix + its name: the temp dirs the processes
    ran in are deleted, their logs are kept for post-mortems."""
    for name, src in logs.items():
        if Path(src).is_file():
            with contextlib.suppress(OSError):
                shutil.copyfile(src, dest_dir / f"{prefix}{name}")


def write_results(results_dir: Path, name: str, doc: dict[str, Any], markdown: str) -> str:
    """Write results_dir/name.json (`doc`) and name.md; the line that says so, for the end of
    the output."""
    json_path, md_path = results_dir / f"{name}.json", results_dir / f"{name}.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(markdown)
    return f"wrote {json_path} and {md_path}"


def matching(items: list[Any], patterns: str) -> list[Any]:
    """The items (scenarios) whose `key` contains one of the comma-separated `patterns`; all of
    them when `patterns` is empty."""
    if not patterns:
        return items
    wanted = [w.strip() for w in patterns.split(",") if w.strip()]
    return [s for s in items if any(w in s.key for w in wanted)]


class Budget:
    """A time budget for a list of runs, counted from its creation: a run is started only if
    its hard cap still fits, so the whole list ends in bounded time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def skip(self, key: str, timeout_s: float) -> dict[str, str] | None:
        """None if a run capped at `timeout_s` still fits; otherwise the result that records it
        as skipped (and the line that says so)."""
        if time.monotonic() - self.started + timeout_s <= self.seconds:
            return None
        log(f"    {key:<22} skipped (time budget)")
        return {"skipped": f"time budget of {self.seconds:.0f} s used up"}
