"""The Go load generator (tests/bench/loadgen): its build (cached by a hash of its sources), the
flags of one run, one run with its JSON result, a `Scenario` (a named run and the figures it
reports), and a long-lived loadgen in idle mode driven over its stdin (conn_capacity.py)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.bench.harness.common import BENCH_DIR, HOST, RESULTS_DIR, log, run_text, tail
from tests.bench.harness.processes import signal_group
from tests.bench.harness.procfs import proc_status_kib

LOADGEN_SRC = BENCH_DIR / "loadgen"
IDLE_KEEPALIVE_S = 600  # idle connections: keepalive far beyond any measurement


def add_loadgen_options(ap: argparse.ArgumentParser, *, results: bool = True) -> None:
    """The options every benchmark script shares: a prebuilt loadgen, where the built one is
    cached, and (with `results`) where results are written."""
    ap.add_argument("--loadgen", type=Path, help="use this prebuilt loadgen binary")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "mqtt-bridge-bench",
        help="where the loadgen binary is cached",
    )
    if results:
        ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)


def build_loadgen(cache_root: Path) -> Path:
    """The loadgen binary for the current sources and Go version, built on first use."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("error: `go` not found on PATH; it is needed to build tests/bench/loadgen")
    h = hashlib.sha256()
    for f in sorted(LOADGEN_SRC.iterdir()):
        if f.is_file() and (f.suffix == ".go" or f.name in ("go.mod", "go.sum")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    h.update(run_text([go, "version"]).encode())
    out = cache_root / f"loadgen-{h.hexdigest()[:16]}"
    if out.exists():
        return out
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = cache_root / f".loadgen-build-{os.getpid()}"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    log(f"building loadgen -> {out}")
    try:
        p = subprocess.run(
            [go, "build", "-o", str(tmp), "."],
            cwd=LOADGEN_SRC,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit("error: go build of loadgen timed out after 600 s") from e
    if p.returncode != 0:
        raise SystemExit(f"error: go build of loadgen failed:\n{p.stdout}{p.stderr}")
    tmp.replace(out)
    return out


def loadgen_args(
    mode: str,
    qos: int,
    *,
    size: int,
    duration: float | str,
    timeout: float | str,
    count: int = 1_000_000,
    pubs: int = 1,
    subs: int = 1,
    rate: int | None = None,
    idle: str = "1s",
    window: int | None = 100,
    flags: dict[str, str] | None = None,
) -> dict[str, str]:
    """The load generator's flags for one run (every benchmark script builds its runs here)."""

    def seconds(value: float | str) -> str:
        return value if isinstance(value, str) else f"{value}s"

    args = {
        "-mode": mode,
        "-qos": str(qos),
        "-pubs": str(pubs),
        "-subs": str(subs),
        "-size": str(size),
        "-count": str(count),
        "-duration": seconds(duration),
        "-timeout": seconds(timeout),
        "-idle": idle,
    }
    if rate is not None:
        args["-rate"] = str(rate)
    if window is not None:
        args["-window"] = str(window)
    return {**args, **(flags or {})}


def run_loadgen(
    loadgen: Path, port: int, args: dict[str, str], client: str, hard_timeout: float
) -> tuple[dict[str, Any], list[str]]:
    """One run against HOST:port: (its JSON result, with `errors` when it failed, and the
    command line). The process is killed at `hard_timeout`."""
    cmd = [str(loadgen), "-addr", f"{HOST}:{port}", "-client", client]
    for k, v in args.items():
        # Go's flag package takes booleans only as -name=value.
        cmd += [f"{k}={v}"] if v in ("true", "false") else [k, v]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=hard_timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"errors": [f"loadgen killed after {hard_timeout:.0f} s"]}, cmd
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    try:
        res: dict[str, Any] = json.loads(line)
    except json.JSONDecodeError:
        res = {
            "errors": [
                f"loadgen rc={p.returncode}, unparseable output: "
                f"{p.stdout[-500:]!r} {p.stderr[-500:]!r}"
            ]
        }
    if p.returncode != 0:
        res.setdefault("errors", []).append(f"loadgen exit code {p.returncode}")
    return res, cmd


LATENCY_METRICS = [
    ("p50 ms", "latency.p50_ms", False),
    ("p90 ms", "latency.p90_ms", False),
    ("p99 ms", "latency.p99_ms", False),
    ("max ms", "latency.max_ms", False),
]
STAMPED_THROUGHPUT_METRICS = [
    ("msgs/s", "msgs_per_s", True),
    # What the publishers got through: with at most 100 unacknowledged each, the rate
    # messages were stored and PUBACKed (deliveries can lag behind it).
    ("pub msgs/s", "publish_rate", True),
    ("p50 ms", "latency.p50_ms", False),
    ("p99 ms", "latency.p99_ms", False),
]


@dataclass(frozen=True)
class Scenario:
    """One loadgen run with a key (in the results) and a title (in the tables); a script
    subclasses it to add what selects where the run goes."""

    key: str
    title: str
    mode: str  # "throughput" | "latency"
    qos: int
    size: int
    args: dict[str, str]
    timeout_s: float

    def metrics(self) -> list[tuple[str, str, bool]]:
        """(label, path in the loadgen result, higher_is_better). A throughput run that stamps
        its payloads (loadgen -stamp) also gives the publishers' rate and the latency under
        full load."""
        if self.mode == "latency":
            return LATENCY_METRICS
        if self.args.get("-stamp") == "true":
            return STAMPED_THROUGHPUT_METRICS
        return [("msgs/s", "msgs_per_s", True)]


def idle_command(
    loadgen: Path | str,
    port: int,
    sources: str,
    step_timeout_s: float | str,
    timeout_s: float | str,
    *,
    client_id: str | None = None,
    concurrency: int | None = None,
) -> list[str]:
    """The command of a loadgen in idle mode (see loadgen/idle.go): connections from the
    `sources` addresses, held with IDLE_KEEPALIVE_S, opened, pinged and closed on command."""
    cmd = [str(loadgen), "-mode", "idle", "-addr", f"{HOST}:{port}"]
    if client_id is not None:
        cmd += ["-id", client_id]
    cmd += ["-src", sources, "-keepalive", str(IDLE_KEEPALIVE_S)]
    if concurrency is not None:
        cmd += ["-concurrency", str(concurrency)]
    return [*cmd, "-step-timeout", f"{step_timeout_s}s", "-timeout", f"{timeout_s}s"]


class LoadgenProcess:
    """One loadgen in idle mode: commands go to its stdin, one JSON reply per command comes
    back on stdout (read by a thread, so several processes work on a step at once)."""

    def __init__(self, cmd: list[str], stderr_path: Path) -> None:
        self.cmd = cmd
        self.stderr_path = stderr_path
        self._stderr: IO[bytes] = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(line)
        self._replies.put(None)  # EOF

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it exited; reply() reports that with its stderr

    def reply(self, timeout: float) -> dict[str, Any]:
        """The answer to the last command, or a dict with only ``errors`` explaining why not."""
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            return {
                "errors": [f"loadgen pid {self.proc.pid} did not answer within {timeout:.0f} s"]
            }
        if line is None:
            self.proc.wait(5)
            return {
                "errors": [
                    f"loadgen pid {self.proc.pid} exited with code {self.proc.returncode}: "
                    f"{tail(self.stderr_path, 5)}"
                ]
            }
        try:
            result: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            return {"errors": [f"unparseable loadgen reply {line[:300]!r}"]}
        return result

    def rss_kib(self) -> int | None:
        return proc_status_kib(self.proc.pid, "VmRSS")

    def kill(self) -> None:
        if self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self._stderr.close()
